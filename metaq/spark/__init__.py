"""spark layer (see DESIGN §2)."""
