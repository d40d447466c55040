build {
  name    = "kiln-digitalocean"
  sources = ["source.digitalocean.gpu"]

  # The playbook's image_cleanup role runs last and fails the build on any
  # FAIL of its checks, so no separate check follows here: a failed play
  # leaves no snapshot.
  provisioner "ansible" {
    playbook_file = "${path.root}/../playbook.yml"
    user          = "root"
    extra_arguments = [
      "--extra-vars",
      jsonencode({
        kiln_agent_wheel        = abspath(var.kiln_wheel)
        kiln_agent_profiles_dir = abspath(local.profiles_dir)
        kiln_models             = var.kiln_models
        # DigitalOcean's Marketplace check as published today, run at the end of the play; a FAIL fails the build.
        image_cleanup_marketplace_check_url = var.marketplace_check_url
      }),
    ]
    ansible_env_vars = [
      "ANSIBLE_HOST_KEY_CHECKING=False",
      # The roles live beside image/, not under the playbook's folder.
      "ANSIBLE_ROLES_PATH=${path.root}/../../roles",
      # Ansible reaches the machine through Packer's local SSH proxy, whose
      # host key is ssh-rsa; OpenSSH >= 8.8 refuses that by default
      # (hashicorp/packer-plugin-ansible#69, #140). Allowed for this proxy
      # on 127.0.0.1 only; the first three options are Ansible's defaults.
      "ANSIBLE_SSH_ARGS=-C -o ControlMaster=auto -o ControlPersist=60s -o HostKeyAlgorithms=+ssh-rsa -o PubkeyAcceptedKeyTypes=+ssh-rsa",
    ]
  }
}
