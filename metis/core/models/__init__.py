"""The model registry: declared models, aliases, credentials and adapters, and their frozen types."""
