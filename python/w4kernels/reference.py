"""Plain-torch reference of every operator: the executable spec."""
