"""`toolatlas adopt`: turn an MCP client's server list into a toolatlas config.

`clients` reads the client files, `values` turns their strings into toolatlas ones (secrets
out), `convert` makes upstreams of the entries, `render` writes the TOML, `rewrite` puts the
toolatlas shim into the client file (with a backup and undo). `cli` is the front end.
"""
