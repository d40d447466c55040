# Variables of the local QEMU build: no cloud account, a qcow2 image out.
# kiln_wheel has no default.

variable "base_image" {
  type        = string
  default     = "output/base/debian-12.qcow2"
  description = "Local qcow2 base (Debian 12 generic cloud image, with cloud-init); relative paths are from the directory packer runs in."
}

variable "base_image_checksum" {
  type        = string
  default     = "none"
  description = "Checksum of base_image, e.g. \"sha512:...\" or \"file:SHA512SUMS\"; \"none\" (the default, with a warning) skips the check of a local file."
}

variable "kiln_version" {
  type        = string
  default     = "0.1.0"
  description = "kiln version baked in; part of the image name."
}

variable "kiln_wheel" {
  type        = string
  description = "Path to the built kiln wheel (dist/kiln-*.whl) that the playbook installs."

  validation {
    # substr, not can(regex(...)): in Packer 1.6.6 that condition is false
    # even for "x.whl", and regexall/endswith do not exist there.
    condition     = substr(var.kiln_wheel, -4, -1) == ".whl"
    error_message = "The kiln_wheel variable must be the path of a built wheel (*.whl): pass -var kiln_wheel=dist/kiln-VERSION-py3-none-any.whl."
  }
}

variable "profiles_dir" {
  type        = string
  default     = ""
  description = "Model catalog copied into the image; empty means the repository's profiles/."
}

variable "disk_size" {
  type        = string
  default     = "40G"
  description = "Size the copied base disk is grown to before boot."
}

variable "output_directory" {
  type        = string
  default     = ""
  description = "Where the finished qcow2 goes; empty means output/qemu/kiln-<version>. Must not exist yet."
}

variable "memory" {
  type    = number
  default = 4096
}

variable "cpus" {
  type    = number
  default = 4
}
