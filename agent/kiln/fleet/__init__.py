"""Fleets of kiln droplets behind a DigitalOcean load balancer."""
