"""Baking kiln images: the local Debian build (mmdebstrap, the Ansible roles over a chroot, a bootable
qcow2), the DigitalOcean build through Packer, and the QEMU boot smoke test of a built image."""
