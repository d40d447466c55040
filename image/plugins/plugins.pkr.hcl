# Plugin requirements for current Packer (1.7+; required from 1.11 on, where the
# DigitalOcean, QEMU and Ansible components are no longer bundled with Packer).
#
# Current Packer:   packer init image/plugins && packer build image/digitalocean
# Debian's 1.6.6:   skip this folder; everything used is built in, and 1.6.6
#                   rejects the required_plugins block below.
#
# Why a folder of its own: Packer loads every *.pkr.hcl of ONE folder and cannot
# include another, and this block cannot sit in image/digitalocean or image/qemu
# without breaking 1.6.6. It does not need to: `packer init` installs plugins
# into the global plugin directory ($HOME/.config/packer/plugins, or
# $HOME/.packer.d/plugins when that exists, or $PACKER_PLUGIN_PATH), and
# `packer build`/`validate` of any folder then loads them in two phases:
# plugins named in required_plugins first, then "discover the remainder of the
# installed plugins", named after the binary (packer-plugin-digitalocean gives
# the `digitalocean` builder). Sources: developer.hashicorp.com/packer/docs/
# commands/init ("Installation location") and docs/plugins/creation/
# plugin-load-spec ("Loading process"). Without `packer init` first, a current
# Packer fails with an unknown-builder error for `digitalocean`/`qemu`.
# `packer plugins install github.com/digitalocean/digitalocean` (and the other
# two) is the manual equivalent.
packer {
  required_version = ">= 1.7.0"

  required_plugins {
    digitalocean = {
      source  = "github.com/digitalocean/digitalocean"
      version = ">= 1.4.0"
    }
    qemu = {
      source  = "github.com/hashicorp/qemu"
      version = ">= 1.1.0"
    }
    ansible = {
      source  = "github.com/hashicorp/ansible"
      version = ">= 1.1.0"
    }
  }
}
