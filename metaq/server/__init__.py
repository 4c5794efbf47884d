"""server layer (see DESIGN §2)."""
