"""The Hugging Face Hub: which repositories a plan needs, whether this machine may read them, one download for all."""
