#!/usr/bin/env bash
# Passwordless ssh to this machine (127.0.0.1 and localhost), for tests/pretrain/test_multinode.py's DeepSpeed
# multi-node launch over ssh (pdsh, or ssh itself): two "nodes" of one machine, as on a cluster.
#
# Installs openssh-server and pdsh with apt-get when missing (root only; BERTPIPE_NO_APT=1: never), makes
# this user a key when it has none (~/.ssh/id_ed25519) and authorizes it, trusts this machine's host key,
# and starts sshd when nothing listens on port 22. Idempotent. Exit 0 when `ssh 127.0.0.1 true` works
# without a password; else 1 with one line saying why.
set -u
why() { echo "multinode_ssh: $*" >&2; exit 1; }
ok() { ssh -o BatchMode=yes -o ConnectTimeout=5 127.0.0.1 true 2>/dev/null \
       && ssh -o BatchMode=yes -o ConnectTimeout=5 localhost true 2>/dev/null; }
ok && exit 0

SSHD=$(command -v sshd || echo /usr/sbin/sshd)
if [ ! -x "$SSHD" ] || ! command -v pdsh >/dev/null || ! command -v ssh >/dev/null; then
    [ "${BERTPIPE_NO_APT:-0}" = 1 ] && why "openssh-server/pdsh missing and BERTPIPE_NO_APT=1"
    [ "$(id -u)" = 0 ] || why "openssh-server/pdsh missing and not root (install them: apt-get install openssh-server pdsh)"
    command -v apt-get >/dev/null || why "openssh-server/pdsh missing and no apt-get"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends openssh-server openssh-client pdsh; } \
        >/tmp/multinode_ssh_apt.log 2>&1 || why "apt-get install openssh-server pdsh failed (/tmp/multinode_ssh_apt.log)"
    SSHD=$(command -v sshd || echo /usr/sbin/sshd)
fi
[ -x "$SSHD" ] || why "no sshd after the install"

mkdir -p ~/.ssh && chmod 700 ~/.ssh
[ -f ~/.ssh/id_ed25519 ] || ssh-keygen -q -t ed25519 -N "" -f ~/.ssh/id_ed25519 || why "ssh-keygen failed"
touch ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys
grep -qF "$(cat ~/.ssh/id_ed25519.pub)" ~/.ssh/authorized_keys || cat ~/.ssh/id_ed25519.pub >> ~/.ssh/authorized_keys
grep -q "bertpipe multinode_ssh" ~/.ssh/config 2>/dev/null || cat >> ~/.ssh/config <<'CFG'
# bertpipe multinode_ssh: this machine under its two names
Host 127.0.0.1 localhost
    StrictHostKeyChecking accept-new
    BatchMode yes
CFG
chmod 600 ~/.ssh/config

if ! (exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null; then
    [ "$(id -u)" = 0 ] || why "sshd is not running and only root can start it"
    ssh-keygen -A >/dev/null 2>&1
    mkdir -p /run/sshd
    "$SSHD" -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no || why "sshd did not start"
    sleep 1
fi
ok || why "ssh 127.0.0.1 still asks for a password or is refused"
exit 0
