"""The full-screen terminal app of `metis chat` (Textual); see docs/tui.md."""
