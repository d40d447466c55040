"""The user's choice: what to serve and how, from user-data, droplet tags and a local file."""
