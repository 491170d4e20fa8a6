"""The MLX backend (Apple silicon via Metal; MLX's CPU backend elsewhere)."""
