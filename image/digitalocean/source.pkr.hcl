locals {
  # One timestamp for the snapshot and the droplet, so they can be matched.
  stamp         = formatdate("YYYYMMDD-hhmm", timestamp())
  snapshot_name = "kiln-${var.kiln_version}-${local.stamp}"
  profiles_dir  = var.profiles_dir != "" ? var.profiles_dir : "${path.root}/../../profiles"
}

# The builder makes a temporary SSH key, starts the droplet, and after the
# provisioners powers it off and snapshots it; the droplet is then destroyed.
source "digitalocean" "gpu" {
  api_token     = var.do_token
  image         = var.base_image
  region        = var.region
  size          = var.size
  ssh_username  = "root"
  snapshot_name = local.snapshot_name
  droplet_name  = "kiln-build-${local.stamp}"
  tags          = ["kiln", "kiln-build"]
  monitoring    = false
  # GPU droplets take longer to become active and their large disks take
  # longer to snapshot than the defaults allow.
  state_timeout    = "20m"
  snapshot_timeout = "120m"
}
