"""The job's ssh keys, derived from the job secret, through ``cryptography``.

Every node derives the same key pairs from the job secret (ed25519 needs
only a 32-byte seed), so no key file is copied between nodes. The key
arithmetic and the OpenSSH file formats are ``cryptography``'s, an optional
extra of the ssh modes (``pip install 'determined_launch[ssh]'``), imported
only when a plan needs keys.

The private key file is not byte-for-byte a function of the seed:
OpenSSH's format carries two random "check" integers (they only detect a
wrong passphrase). The key it holds is, so two nodes' files are the same
key; ``SshKey`` compares by that key.
"""

from __future__ import annotations

import dataclasses
import hmac

from determined_launch.errors import LaunchError

EXTRA_HINT = "pip install 'determined_launch[ssh]'"


@dataclasses.dataclass(frozen=True)
class SshKey:
    """An ed25519 key pair in OpenSSH's file formats."""

    #: ``-----BEGIN OPENSSH PRIVATE KEY-----`` ...
    private_file: str = dataclasses.field(compare=False, repr=False)
    #: ``ssh-ed25519 AAAA... comment``
    public_line: str

    @property
    def public_key(self) -> str:
        """``ssh-ed25519 AAAA...`` without the comment."""
        return " ".join(self.public_line.split()[:2])


def ed25519_key(seed: bytes, comment: str) -> SshKey:
    """The key pair of a 32-byte seed (RFC 8032), as OpenSSH writes it."""
    try:
        from cryptography.hazmat.primitives import serialization as ser
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        raise LaunchError(
            f"ssh mode needs the 'cryptography' package for its keys: {EXTRA_HINT}"
        ) from None
    key = Ed25519PrivateKey.from_private_bytes(seed)
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    return SshKey(private_file=private.decode(), public_line=f"{public.decode()} {comment}")


def derive_key(secret: str, purpose: str) -> SshKey:
    """The job's key for ``purpose`` ("client" or "host"): same on every node."""
    seed = hmac.new(secret.encode(), b"det-launch ssh " + purpose.encode(), "sha256").digest()
    return ed25519_key(seed, f"det-launch-{purpose}")
