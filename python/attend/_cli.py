"""The `attend` console script of the pip package: runs the command-line tool
that the wheel carries in attend/bin (built with the extension where CLI11 was
found at build time)."""

import os
import sys
from pathlib import Path


def executable() -> Path:
    return Path(__file__).resolve().parent / "bin" / "attend"


def main() -> None:
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.exit(f"attend: this installation has no command-line tool ({exe} is missing): the wheel was built "
                 "without CLI11's headers (Debian: libcli11-dev); install them and reinstall the package")
    os.execv(exe, [str(exe), *sys.argv[1:]])


if __name__ == "__main__":
    main()
