"""The `specfill` command line: one module per subcommand."""
