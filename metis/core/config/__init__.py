"""The configuration file family: safe positioned YAML loading, the shared field checks and the
`models.yaml` format.
"""
