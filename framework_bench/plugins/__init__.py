"""The plugin contract (see CONTRIBUTING.md, "What a plugin may import")."""
