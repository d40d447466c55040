"""The model catalog: validated YAML profiles and user models read from config.json."""
