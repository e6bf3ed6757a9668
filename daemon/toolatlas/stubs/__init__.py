"""`toolatlas stubs`: typed Python modules over the tools a caller may use, for agents that
write code against MCP tools ("code execution with MCP"). `generate` (stubs/generate.py)
turns tool definitions into source files; the CLI (stubs/cli.py) fetches the definitions
from the daemon and writes them; `client_template.py` is copied into the output as its
standard-library client."""
