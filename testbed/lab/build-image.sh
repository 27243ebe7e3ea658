#!/bin/bash
# Builds the lab's proxy test image: a bootable Debian 12 qcow2 from Debian packages alone.
#   build-image.sh OUT.qcow2        (root; needs mmdebstrap, grub-pc-bin, fdisk, e2fsprogs, qemu-utils)
# Debian's full kernel (linux-image-amd64): the cloud kernel lacks AHCI, and the spec's seed is a SATA
# cdrom. cloud-init reads NoCloud only; qemu-guest-agent reports the IP; tinyproxy is the proxy (the
# VMs have no internet, so everything they run is in here). No loop device or mount: mke2fs -d writes
# the root fs into a partition of a raw file, GRUB's boot.img and core.img are written in with dd.
# The lab caches the result keyed by this file's sha256: editing this recipe rebuilds the image.
set -euo pipefail
out=$1
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECMIRROR=${SECMIRROR:-http://deb.debian.org/debian-security}
KERNEL=linux-image-amd64
work=$(mktemp -d "$(dirname "$out")/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
uuid=$(cat /proc/sys/kernel/random/uuid)
start=$(date +%s)
# Boot time under software emulation (TCG, docs/lab.md "The test image"): every module load, process and
# unit costs ~10x what it does on hardware, so the image carries only what a proxy VM uses.
# - initramfs with the root disk's modules only (MODULES=list): MODULES=most unpacked 29 MB and had udev
#   load every driver twice (initramfs, then root); the root's udev still loads what the devices need.
# - modules nothing here uses, kept from udev's autoload: USB, SMBus/LPC/watchdog, PS/2 mouse, PC speaker,
#   nested KVM, CPU frequency and crypto accelerators (TCG's `maximum` CPU advertises svm/aes/pclmul;
#   loading kvm alone took tens of seconds), SCSI generic.
BLACKLIST="xhci_pci xhci_hcd usbcore i2c_i801 i2c_smbus lpc_ich iTCO_wdt iTCO_vendor_support psmouse pcspkr
  serio_raw joydev kvm kvm_amd kvm_intel irqbypass aesni_intel ghash_clmulni_intel crc32_pclmul
  crct10dif_pclmul polyval_clmulni sha1_ssse3 sha256_ssse3 sha512_ssse3 intel_rapl_msr intel_rapl_common
  rapl intel_cstate intel_powerclamp coretemp powernow_k8 acpi_cpufreq edac_mce_amd sg"
# - units a proxy VM does not need at boot: modules for LVM/loop/FUSE/EFI pstore, filesystem scrub and
#   trim, apt and dpkg timers (the VMs are offline).
MASK="modprobe@dm_mod.service modprobe@loop.service modprobe@efi_pstore.service modprobe@fuse.service
  sys-fs-fuse-connections.mount e2scrub_reap.service e2scrub_all.timer fstrim.timer apt-daily.timer
  apt-daily-upgrade.timer dpkg-db-backup.timer"
# - cloud-init's modules: the ones user-data for an offline proxy VM uses (bootcmd, write_files, users,
#   passwords, hostname, growpart/resizefs, runcmd and the scripts, power_state); not apt, ntp, locale
#   (baked in), ssh (no sshd), grub-dpkg, keys-to-console, the config-management agents. Each skipped
#   module is one Python import and often a subprocess less in each boot.
printf 'blacklist %s\n' $BLACKLIST > "$work/blacklist.conf"
# The initramfs's module list as a hook (/etc/initramfs-tools/modules is a conffile of the package).
cat > "$work/root-disk-hook" <<'HOOK'
#!/bin/sh
[ "$1" = prereqs ] && exit 0
. /usr/share/initramfs-tools/hook-functions
for m in virtio_pci virtio_blk ext4 crc32c_generic; do force_load "$m"; done
HOOK
cat > "$work/cloud-modules.cfg" <<'CFG'
cloud_init_modules: [seed_random, bootcmd, write_files, growpart, resizefs, set_hostname, update_hostname,
  update_etc_hosts, users_groups]
cloud_config_modules: [set_passwords, runcmd]
cloud_final_modules: [write_files_deferred, scripts_vendor, scripts_per_once, scripts_per_boot,
  scripts_per_instance, scripts_user, final_message, power_state_change]
CFG

mmdebstrap --mode=root --variant=minbase \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --include="systemd-sysv,udev,$KERNEL,initramfs-tools,zstd" \
  --include=cloud-init,cloud-guest-utils,ifupdown,isc-dhcp-client,iproute2,netbase,locales \
  --include=qemu-guest-agent,tinyproxy,procps,less \
  --essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d"; printf "COMPRESS=zstd\nMODULES=list\n" > "$1/etc/initramfs-tools/conf.d/zstd"' \
  --essential-hook="mkdir -p \"\$1/etc/initramfs-tools/hooks\"; install -m 755 '$work/root-disk-hook' \"\$1/etc/initramfs-tools/hooks/egress-lab-root-disk\"" \
  --customize-hook="echo 'UUID=$uuid / ext4 errors=remount-ro 0 1' > \"\$1/etc/fstab\"" \
  --customize-hook='printf "auto lo\niface lo inet loopback\n\nsource /etc/network/interfaces.d/*\n" > "$1/etc/network/interfaces"' \
  --customize-hook='printf "datasource_list: [ NoCloud, None ]\n" > "$1/etc/cloud/cloud.cfg.d/90_dpkg.cfg"' \
  --customize-hook='printf "ssh_genkeytypes: []\n" > "$1/etc/cloud/cloud.cfg.d/91_no_sshd.cfg"' \
  --customize-hook='echo "en_US.UTF-8 UTF-8" > "$1/etc/locale.gen"; chroot "$1" locale-gen >/dev/null; echo LANG=en_US.UTF-8 > "$1/etc/default/locale"' \
  --customize-hook='echo localhost > "$1/etc/hostname"; : > "$1/etc/machine-id"; rm -f "$1/var/lib/dbus/machine-id"' \
  --customize-hook="cp '$work/blacklist.conf' \"\$1/etc/modprobe.d/egress-lab-unused.conf\"" \
  --customize-hook="cp '$work/cloud-modules.cfg' \"\$1/etc/cloud/cloud.cfg.d/92_modules.cfg\"" \
  --customize-hook="chroot \"\$1\" systemctl -q mask $(echo $MASK); chroot \"\$1\" systemctl -q set-default multi-user.target" \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log' \
  bookworm "$root" \
  "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECMIRROR bookworm-security main" \
  2> "$work/mmdebstrap.log" || { tail -30 "$work/mmdebstrap.log" >&2; exit 1; }
echo "mmdebstrap done after $(( $(date +%s) - start ))s"

kver=$(basename "$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)")
kver=${kver#vmlinuz-}
truncate -s 2G "$work/disk.raw"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$work/disk.raw"
sectors=$(sfdisk -l -o Sectors "$work/disk.raw" | tail -1 | tr -d ' ')
mke2fs -q -t ext4 -L root -U "$uuid" -O ^metadata_csum_seed,^orphan_file -E offset=$((2048 * 512)) \
  -d "$root" "$work/disk.raw" $((sectors / 2))k
cat > "$work/early.cfg" <<GRUB
set root=(hd0,msdos1)
linux /boot/vmlinuz-$kver root=UUID=$uuid ro console=ttyS0,115200n8 tsc=reliable
initrd /boot/initrd.img-$kver
boot
GRUB
grub-mkimage -O i386-pc -o "$work/core.img" -p '(hd0,msdos1)/boot/grub' -c "$work/early.cfg" \
  biosdisk part_msdos ext2 linux boot
[ "$(stat -c %s "$work/core.img")" -lt $((2047 * 512)) ] || { echo "core.img too big for the MBR gap" >&2; exit 1; }
dd if=/usr/lib/grub/i386-pc/boot.img of="$work/disk.raw" bs=440 count=1 conv=notrunc status=none
dd if="$work/core.img" of="$work/disk.raw" bs=512 seek=1 conv=notrunc status=none
qemu-img convert -c -O qcow2 "$work/disk.raw" "$work/out.qcow2"
mv "$work/out.qcow2" "$out"
echo "built $out ($(du -m "$out" | cut -f1) MiB, kernel $kver) in $(( $(date +%s) - start ))s"
