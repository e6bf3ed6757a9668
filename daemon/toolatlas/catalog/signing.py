"""Ed25519 operator keys: generate, store, load, sign, verify.

The private key lives in a PKCS#8 PEM file with mode 0600 (written once, never overwritten);
the public key is a one-line text file `ed25519:<base64 of the 32 raw bytes>` (a PEM
SubjectPublicKeyInfo file is accepted too). The daemon only ever loads the public key.
Every failure raises `SignatureError` with a sentence naming the file or the reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from toolatlas.errors import SignatureError
from toolatlas.paths import read_regular

log = logging.getLogger(__name__)
_WARNED_OPEN: set[str] = set()  # private key files already warned about (once a process)

PUBLIC_PREFIX = "ed25519:"

__all__ = [
    "Ed25519PrivateKey",
    "Ed25519PublicKey",
    "PUBLIC_PREFIX",
    "generate_private_key",
    "write_private_key",
    "load_private_key",
    "load_public_key",
    "public_key_text",
    "parse_public_key",
    "key_id",
    "sign",
    "verify",
]


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_text(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """`ed25519:<base64>`: the form `keygen` prints and the public key file holds."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_PREFIX + base64.b64encode(raw).decode("ascii")


def key_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """Short fingerprint (16 hex digits of SHA-256 of the raw public key) shown in status."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _write_exclusive(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL: refuse to overwrite, atomically, even against a concurrent keygen.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError as exc:
        raise SignatureError(f"{str(path)!r} already exists; refusing to overwrite a key file") from exc
    except OSError as exc:
        raise SignatureError(f"cannot create key file {str(path)!r}: {exc.strerror}") from exc
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed or widened nothing, but be explicit
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_private_key(path: str | os.PathLike[str], key: Ed25519PrivateKey) -> Path:
    """Write `key` to `path` (mode 0600) and its public key to `path.pub` (mode 0644).

    Refuses (SignatureError) if either file exists. Returns the public key file's path.
    """
    priv = Path(path)
    pub = priv.with_name(priv.name + ".pub")
    if pub.exists():
        raise SignatureError(f"{str(pub)!r} already exists; refusing to overwrite a key file")
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_exclusive(priv, pem, 0o600)
    _write_exclusive(pub, (public_key_text(key) + "\n").encode("ascii"), 0o644)
    return pub


def read_bytes(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of a key or card file; SignatureError "cannot read WHAT 'PATH': reason"."""
    p = Path(path)
    try:
        return read_regular(p)
    except OSError as exc:
        raise SignatureError(f"cannot read {what} {str(p)!r}: {exc.strerror}") from exc


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """The Ed25519 key in `path` (unencrypted PEM). A file other users can read is used, with a
    warning once a process (ssh refuses such a key; an operator's key in a shared group may
    be deliberate)."""
    p = Path(path)
    data = read_bytes(p, "private key")
    head = data.lstrip()
    if head.startswith((PUBLIC_PREFIX.encode(), b"-----BEGIN PUBLIC KEY", b"ssh-")):
        raise SignatureError(f"{str(p)!r} holds a public key; give the private key file (`keygen --out` wrote it "
                             "beside the .pub file)")
    if head.startswith(b"-----BEGIN OPENSSH PRIVATE KEY"):
        raise SignatureError(f"{str(p)!r} is an OpenSSH key; cards are signed with a PKCS#8 PEM key: make one "
                             "with `toolatlas keygen --out PATH`")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"{str(p)!r} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{str(p)!r} holds a {type(key).__name__}, not an Ed25519 key")
    try:
        mode = stat.S_IMODE(p.stat().st_mode)
    except OSError:
        mode = 0
    if mode & 0o077 and str(p) not in _WARNED_OPEN:
        _WARNED_OPEN.add(str(p))
        log.warning("cards.private_key_readable path=%s mode=%04o: other users can read this private key; "
                    "`chmod 600 %s`", p, mode, p)
    return key


def parse_public_key(text: str, *, source: str = "public key") -> Ed25519PublicKey:
    """Parse `ed25519:<base64>` or a PEM SubjectPublicKeyInfo block."""
    text = text.strip()
    if text.startswith("-----BEGIN") and "PRIVATE KEY-----" in text.split("\n", 1)[0]:
        raise SignatureError(f"{source} holds a private key; give the public key (the .pub file `keygen` wrote "
                             "beside it)")
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text.encode("ascii"))
        except (ValueError, UnicodeEncodeError) as exc:
            raise SignatureError(f"{source} is not a valid PEM public key: {exc}") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise SignatureError(f"{source} holds a {type(key).__name__}, not an Ed25519 key")
        return key
    if text.startswith("ssh-"):
        raise SignatureError(f"{source} is an OpenSSH public key; cards use the `{PUBLIC_PREFIX}<base64>` line "
                             "`toolatlas keygen` writes (PATH.pub)")
    body = text[len(PUBLIC_PREFIX):] if text.startswith(PUBLIC_PREFIX) else text
    try:
        raw = base64.b64decode(body, validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as exc:
        raise SignatureError(f"{source} is not an Ed25519 public key ({PUBLIC_PREFIX}<base64 of 32 bytes>)") from exc


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    p = Path(path)
    try:
        text = read_regular(p).decode("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not ASCII text"
        raise SignatureError(f"cannot read public key {str(p)!r}: {reason}") from exc
    return parse_public_key(text, source=f"public key file {str(p)!r}")


def sign(key: Ed25519PrivateKey, payload: bytes) -> str:
    """Base64 Ed25519 signature of `payload`."""
    return base64.b64encode(key.sign(payload)).decode("ascii")


def verify(key: Ed25519PublicKey, payload: bytes, signature: str) -> None:
    """Raise SignatureError unless `signature` (base64) is valid for `payload`."""
    try:
        sig = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SignatureError("signature is not valid base64") from exc
    if len(sig) != 64:
        raise SignatureError(f"signature has {len(sig)} bytes, an Ed25519 signature has 64")
    try:
        key.verify(sig, payload)
    except InvalidSignature as exc:
        raise SignatureError("signature does not match the card's content (tampered, or signed by another key)") from exc
