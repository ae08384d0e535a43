# Writes two device descriptors nested deep in DIR: the issue's 3 M levels
# (6 MB, past the size cap) and 200 k levels (400 KB, within it).
foreach(depth 3000000 200000)
  string(REPEAT "[" ${depth} open)
  string(REPEAT "]" ${depth} close)
  file(WRITE "${DIR}/deep${depth}.json" "{\"deviceVer\":900,\"x\":${open}${close}}")
endforeach()
