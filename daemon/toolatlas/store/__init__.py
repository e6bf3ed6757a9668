"""State shared by replicas in PostgreSQL (`[store] url`): see ports.py for what features
use, replica.py for the service, wiring.py for what the gateway shares today, and
docs/deployment.md for running several replicas. Importing this package does not import
the database driver (only client.py does, when a replica connects)."""
