"""client layer (see DESIGN §2)."""
