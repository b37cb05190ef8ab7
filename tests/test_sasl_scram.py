"""kproxy's SCRAM arithmetic against an independent implementation (scramp, the one pg8000 uses).

Each side of an exchange is played once by kproxy's pieces and once by scramp: a wrong key
derivation, proof or signature on kproxy's side makes scramp refuse it (or kproxy refuse scramp).
"""

from __future__ import annotations

import pytest
import scramp

from kproxy.sasl import scram


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kproxy_client_against_scramp_server(mechanism: str) -> None:
    mech = scramp.ScramMechanism(mechanism)
    salt, stored, server_key, iterations = mech.make_auth_info("s3cret", iteration_count=4096)
    server = mech.make_server(lambda _user: (salt, stored, server_key, iterations))

    cnonce = scram.nonce()
    first_bare = f"n={scram.escape_name('al,ice=')},r={cnonce}"
    server.set_client_first(scram.GS2_HEADER + first_bare)
    server_first = server.get_server_first()
    attrs = scram.attributes(server_first)
    assert attrs["r"].startswith(cnonce)
    salted = scram.salted_password(mechanism, "s3cret", scram.unb64(attrs["s"], "salt"), int(attrs["i"]))
    without_proof = f"c={scram.b64(scram.GS2_HEADER.encode())},r={attrs['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    proof = scram.client_proof(mechanism, salted, auth_message)
    server.set_client_final(f"{without_proof},p={scram.b64(proof)}")  # raises if the proof is wrong
    signature = scram.attributes(server.get_server_final())["v"]
    expected = scram.server_signature(mechanism, scram.server_key_of(mechanism, salted), auth_message)
    assert scram.unb64(signature, "v") == expected


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scramp_client_against_kproxy_credential(mechanism: str) -> None:
    cred = scram.credential(mechanism, "pässword", iterations=4096)
    client = scramp.ScramClient([mechanism], "bob", "pässword")
    first = client.get_client_first()
    bare = first[len(scram.GS2_HEADER):]
    snonce = scram.attributes(bare)["r"] + scram.nonce()
    server_first = f"r={snonce},s={scram.b64(cred.salt)},i={cred.iterations}"
    client.set_server_first(server_first)
    final = client.get_client_final()
    without_proof, _, proof_text = final.rpartition(",p=")
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    assert scram.verify_client_proof(cred, auth_message, scram.unb64(proof_text, "proof"))
    wrong = scram.credential(mechanism, "other", salt=cred.salt, iterations=cred.iterations)
    assert not scram.verify_client_proof(wrong, auth_message, scram.unb64(proof_text, "proof"))
    client.set_server_final("v=" + scram.b64(scram.server_signature(mechanism, cred.server_key, auth_message)))


def test_names_and_attributes() -> None:
    assert scram.unescape_name(scram.escape_name("a=b,c")) == "a=b,c"
    with pytest.raises(scram.ScramError, match="bad escape"):
        scram.unescape_name("a=4")
    with pytest.raises(scram.ScramError, match="malformed"):
        scram.attributes("r=abc,garbage")
    with pytest.raises(scram.ScramError, match="unsupported SCRAM mechanism"):
        scram.credential("SCRAM-SHA-1", "x")
    with pytest.raises(scram.ScramError, match="iterations"):
        scram.credential("SCRAM-SHA-256", "x", iterations=100)
    with pytest.raises(scram.ScramError, match="iterations 16385 outside"):  # above Kafka's maximum too
        scram.credential("SCRAM-SHA-256", "x", iterations=16385)
