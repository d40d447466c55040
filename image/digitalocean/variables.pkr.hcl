# Variables of the DigitalOcean GPU Droplet snapshot build. Set them with
# -var NAME=VALUE or a *.pkrvars.hcl file; kiln_wheel has no default.

variable "do_token" {
  type        = string
  default     = env("DIGITALOCEAN_TOKEN")
  sensitive   = true
  description = "DigitalOcean API token; read from DIGITALOCEAN_TOKEN, never printed."

  validation {
    condition     = length(var.do_token) > 0
    error_message = "The do_token variable is empty: export DIGITALOCEAN_TOKEN (a DigitalOcean API token with write access)."
  }
}

variable "region" {
  type        = string
  default     = "tor1"
  description = "Region of the build droplet and of the snapshot (tor1 offers GPU Droplets)."
}

variable "size" {
  type        = string
  default     = "gpu-h100x1-80gb"
  description = "Droplet size slug used for the build (a GPU size, so the image is baked on the hardware it serves)."
}

# Plain Ubuntu 24.04 LTS, not DigitalOcean's AI/ML-ready GPU images
# (gpu-h100x1-base, gpu-h100x8-base, ...): those are Ubuntu 22.04 with a
# driver/CUDA stack and slug chosen per GPU family, whereas kiln's playbook owns
# the driver and CUDA versions itself (Blackwell needs a newer driver than
# Hopper images ship) and one base serves every GPU size. 24.04 is supported
# to 2029 and has NVIDIA CUDA repositories. Override with -var base_image=....
variable "base_image" {
  type        = string
  default     = "ubuntu-24-04-x64"
  description = "Slug or ID of the public base image the build droplet starts from."
}

variable "kiln_version" {
  type        = string
  default     = "0.1.0"
  description = "kiln version baked in; part of the snapshot name."
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

# Profiles whose models are baked into the snapshot for this droplet size (the build droplet plans them for its
# own GPUs). Gated repositories need HF_TOKEN in the environment Packer runs in; it reaches Ansible only through it.
variable "kiln_models" {
  type        = list(string)
  default     = []
  description = "Profile names whose models are baked into the image, e.g. [\"llama-3.3-70b-instruct\"]."
}

variable "marketplace_check_url" {
  type        = string
  default     = "https://raw.githubusercontent.com/digitalocean/marketplace-partners/master/scripts/99-img-check.sh"
  description = "DigitalOcean's Marketplace image check, fetched by the build droplet and run last; empty runs the copy kiln carries."
}

variable "profiles_dir" {
  type        = string
  default     = ""
  description = "Model catalog copied into the image; empty means the repository's profiles/."
}
