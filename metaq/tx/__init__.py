"""tx layer (see DESIGN §2)."""
