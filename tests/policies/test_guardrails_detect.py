"""The detectors over a corpus: each kind of data found where it is, and what looks like it
but is not (UUIDs, hashes, order numbers, base64 images, dates, versions) left untouched."""

from __future__ import annotations

import base64
import hashlib
import random

import pytest

from policies.guardrails.detect import Detector

ALL = Detector(["secrets", "card_numbers", "iban", "email", "phone"])

FOUND = [
    # secrets (detect-secrets' plugin families)
    ("key AKIAIOSFODNN7EXAMPLE here", "secret"),
    ("ASIAY34FZKBOKMUTVV7A", "secret"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "secret"),
    ('AWS_SECRET_ACCESS_KEY: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"', "secret"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "secret"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "secret"),
    ("token ghp_" + "A1b2" * 9, "secret"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", "secret"),
    ("glpat-abcdefghij0123456789", "secret"),
    ("xoxb-1234567890-abcdefghijkl", "secret"),
    ("https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXX", "secret"),
    ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "secret"),
    ("SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ", "secret"),
    ("npm_" + "a" * 36, "secret"),
    ("0123456789abcdef0123456789abcdef-us21", "secret"),
    ("AIza" + "B" * 35, "secret"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "secret"),
    ("postgres://admin:hunter2hunter@db.internal:5432/app", "secret"),
    ('{"password": "correct-horse-battery"}', "secret"),
    ("api_key = 'abcd1234efgh5678'", "secret"),
    # card numbers: Luhn, an issuer prefix, groups of four or none
    ("card 4111 1111 1111 1111 on file", "card_number"),
    ("4111-1111-1111-1111", "card_number"),
    ("5500005555555559", "card_number"),
    ("amex 3782 822463 10005", "card_number"),
    # IBANs: the mod-97 checksum
    ("pay to DE89 3704 0044 0532 0130 00 please", "iban"),
    ("GB82WEST12345698765432", "iban"),
    ("email bob.smith+tag@example.co.uk today", "email"),
    ("call +1 202-555-0143 now", "phone"),
    ("(202) 555-0143", "phone"),
    ("+49 30 901820", "phone"),
]

PASSING = [
    "550e8400-e29b-41d4-a716-446655440000",  # UUID
    hashlib.sha256(b"x").hexdigest(),
    hashlib.md5(b"x").hexdigest(),
    "commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
    "order 100234567", "Order #2024-000123", "ORD-12345678", "invoice INV-2026-0042",
    "1234567890123456",  # fails Luhn
    "4111 1111 1111 1112",  # fails Luhn
    "DE89 3704 0044 0532 0130 01",  # fails mod-97
    "version 1.2.3.4", "2026-12-02T04:44:10Z", "x@y", "user@localhost",
    "see https://example.com/a/b?c=d", "the password field is required",
    "[REDACTED:secret]", "tracking 1Z999AA10123456784",
]


@pytest.mark.parametrize(("text", "kind"), FOUND, ids=[f"{k}-{i}" for i, (_, k) in
                                                        enumerate(FOUND)])
def test_each_kind_is_found_and_redacted(text: str, kind: str) -> None:
    redacted, kinds = ALL.redact(text)
    assert kinds == {kind}
    assert f"[REDACTED:{kind}]" in redacted


@pytest.mark.parametrize("text", PASSING)
def test_look_alikes_pass_untouched(text: str) -> None:
    assert ALL.redact(text) == (text, set())


def test_a_base64_image_passes_untouched() -> None:
    rng = random.Random(7)
    for _ in range(20):
        image = base64.b64encode(rng.randbytes(3000)).decode()
        assert ALL.find(image) == []
        assert ALL.find(f"data:image/png;base64,{image}") == []


def test_only_the_kinds_asked_for() -> None:
    emails = Detector(["email"])
    text = "bob@example.com 4111 1111 1111 1111 AKIAIOSFODNN7EXAMPLE"
    assert emails.redact(text) == ("[REDACTED:email] 4111 1111 1111 1111 AKIAIOSFODNN7EXAMPLE",
                                   {"email"})


def test_only_the_credentials_of_a_url_go() -> None:
    assert ALL.redact("https://user:s3cretpass@host/x")[0] == "https://[REDACTED:secret]@host/x"


def test_entropy_is_off_by_default_and_flags_hashes_when_on() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    assert ALL.find(digest) == []
    assert {f.kind for f in Detector(["entropy"]).find(digest)} == {"entropy"}


def test_a_region_reads_national_numbers() -> None:
    assert Detector(["phone"], phone_region="DE").redact("030 901820")[1] == {"phone"}
    assert Detector(["phone"], phone_region="US").redact("030 901820")[1] == set()
