"""The control plane's test PKI: a CA, the API server's serving certificate, service-account
keys and client certificates, and kubeconfigs that authenticate with them."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.processes import LOOPBACK


@dataclass(frozen=True, slots=True)
class Pki:
    """Files of the test PKI: CA, apiserver serving cert, service-account keys, client certs."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    directory: Path

    def client(self, user: str, groups: Iterable[str] = ()) -> tuple[Path, Path]:
        """A client certificate (CN = user, O = groups) signed by the CA: (cert, key)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)  # the CA this harness made
        ca = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject = x509.Name([*names, x509.NameAttribute(NameOID.COMMON_NAME, user)])
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        slug = hashlib.sha1(user.encode()).hexdigest()[:10]
        cert_path, key_path = self.directory / f"client-{slug}.crt", self.directory / f"client-{slug}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path


def make_pki(directory: Path) -> Pki:
    """Self-signed CA, a serving cert for 127.0.0.1/localhost, and a service-account key pair."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    pem = serialization.Encoding.PEM

    def write_key(key: Any, path: Path) -> None:
        path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufrac-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
           .issuer_name(ca_name).public_key(srv_key.public_key()).serial_number(x509.random_serial_number())
           .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
           .add_extension(x509.SubjectAlternativeName([
               x509.DNSName("localhost"), x509.DNSName("kubernetes.default.svc"),
               x509.IPAddress(ipaddress.ip_address(LOOPBACK)),
               x509.IPAddress(ipaddress.ip_address("10.0.0.1"))]), critical=False)
           .sign(ca_key, hashes.SHA256()))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki = Pki(directory / "ca.crt", directory / "ca.key", directory / "apiserver.crt",
              directory / "apiserver.key", directory / "sa.key", directory / "sa.pub", directory)
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    write_key(ca_key, pki.ca_key)
    pki.serving_cert.write_bytes(srv.public_bytes(pem))
    write_key(srv_key, pki.serving_key)
    write_key(sa_key, pki.sa_key)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


def kubeconfig(path: Path, server: str, pki: Pki, user: str, groups: Iterable[str] = ()) -> Path:
    """Write a kubeconfig for ``user`` authenticating with a client certificate."""
    cert, key = pki.client(user, groups)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server,
                                                  "certificate-authority": str(pki.ca_cert)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
    }))
    return path


