"""attend inside other libraries' models.

Each submodule adapts one library and is imported explicitly (importing this
package imports none of them, so it needs nothing beyond attend itself):

    import attend.integrations.transformers   # registers attn_implementation="attend"
"""
