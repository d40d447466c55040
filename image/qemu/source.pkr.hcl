locals {
  image_name   = "kiln-${var.kiln_version}-${formatdate("YYYYMMDD-hhmm", timestamp())}"
  output_dir   = var.output_directory != "" ? var.output_directory : "output/qemu/kiln-${var.kiln_version}"
  profiles_dir = var.profiles_dir != "" ? var.profiles_dir : "${path.root}/../../profiles"
  # Throwaway login for the build only: cloud-init/user-data creates the user
  # with this password, SSH is forwarded on 127.0.0.1 only (see qemuargs), and
  # shutdown_command deletes the user before the disk is kept. Keep in sync
  # with cloud-init/user-data.
  build_user     = "kiln-build"
  build_password = "kiln-build"
}

# Boots a copy of a local cloud image (disk_image = true: no installer, no
# boot_command), reaches it over SSH thanks to a NoCloud seed on a CD labelled
# "cidata", runs the playbook, and keeps the disk as a standalone qcow2.
source "qemu" "local" {
  iso_url      = var.base_image
  iso_checksum = var.base_image_checksum
  disk_image   = true
  # A standalone image, not a thin overlay on the base.
  use_backing_file = false
  disk_size        = var.disk_size
  format           = "qcow2"
  disk_interface   = "virtio"
  net_device       = "virtio-net"
  output_directory = local.output_dir
  vm_name          = "${local.image_name}.qcow2"
  memory           = var.memory
  cpus             = var.cpus

  # TCG, pinned: on kiln's build machines /dev/kvm exists but a KVM guest
  # kernel does not boot, and left unset the builder picks KVM whenever it is
  # available. TCG is slow (expect tens of minutes) but works everywhere.
  accelerator = "tcg"
  headless    = true

  cd_files = ["${path.root}/cloud-init/meta-data", "${path.root}/cloud-init/user-data"]
  cd_label = "cidata"

  qemuargs = [
    # Override the builder's default "-vnc 127.0.0.1:N": no VNC server at all.
    ["-vnc", "none"],
    # Override the default "-netdev user,...,hostfwd=tcp::PORT-:22", which
    # listens on every interface, so the build password is reachable from
    # this host only.
    ["-netdev", "user,id=user.0,hostfwd=tcp:127.0.0.1:{{ .SSHHostPort }}-:22"],
  ]

  communicator = "ssh"
  ssh_username = local.build_user
  ssh_password = local.build_password
  ssh_timeout  = "30m"

  # Runs after the provisioners: forget this boot's cloud-init state, delete
  # the build user (-f: it is logged in), and power off.
  shutdown_command = "sudo sh -c 'cloud-init clean --logs; rm -f /etc/sudoers.d/90-cloud-init-users; userdel -rf ${local.build_user}; shutdown -P now'"
  shutdown_timeout = "10m"
}
