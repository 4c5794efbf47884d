"""store layer (see DESIGN §2)."""
