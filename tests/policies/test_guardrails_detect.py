"""The detectors over a corpus: each kind of data found where it is, and what looks like it
but is not (UUIDs, hashes, order numbers, base64 images, dates, versions) left untouched; a
secret hidden by invisible or look-alike characters found, and redacted where it lies."""

from __future__ import annotations

import base64
import hashlib
import random

import pytest

from policies.guardrails.detect import Detector
from policies.guardrails.fold import fold

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


# A secret as a person (and a model) reads it, that no pattern matches as it is sent.
GITHUB = "ghp_" + "A1b2" * 9
HIDDEN = {
    "zero-width space": "AKIA\u200bIOSFODNN7EXAMPLE",
    "zero-width joiners": "A\u200dK\u200cIAIOSFODNN7EXAMPLE",
    "word joiner, soft hyphen": "AKIA\u2060IOSFODNN7\u00adEXAMPLE",
    "tag characters": "AKIA\U000e0041IOSFODNN7EXAMPLE",
    "variation selector": "AKIA\ufe0fIOSFODNN7EXAMPLE",
    "cyrillic capital I": "AK\u0406AIOSFODNN7EXAMPLE",
    "greek capital omicron": "AKIAIOSF\u039fDNN7EXAMPLE",
    "script g (NFKC leaves it)": "\u0261" + GITHUB[1:],
    "cyrillic small p": "gh\u0440" + GITHUB[3:],
    "fullwidth": "\uff47\uff48\uff50\uff3f" + GITHUB[4:],
    "mathematical bold": "\U0001d420\U0001d421\U0001d429_" + GITHUB[4:],
}


@pytest.mark.parametrize("secret", list(HIDDEN.values()), ids=list(HIDDEN))
def test_a_secret_hidden_by_invisible_or_look_alike_characters_is_found(secret: str) -> None:
    # non-ASCII before it too (a ligature NFKC widens, a look-alike, a removed character), so
    # the span maps back through changes of width
    around = "caf\u00e9 \ufb01le \u0430\u200bb: {}. \u00bd done"
    assert ALL.redact(around.format(secret)) == (around.format("[REDACTED:secret]"), {"secret"})


def test_a_secret_in_cyrillic_prose_is_redacted_where_it_lies() -> None:
    # most of the text folds (Cyrillic look-alikes): the copy is made another way
    around = ("\u041e\u0442\u0447\u0451\u0442 \u043e \u043f\u043e\u0441\u0442\u0430"
              "\u0432\u043a\u0435, \u043a\u043b\u044e\u0447 {} \u043f\u043e\u043b"
              "\u0443\u0447\u0435\u043d.")
    for secret in HIDDEN.values():
        assert ALL.redact(around.format(secret)) == (around.format("[REDACTED:secret]"),
                                                     {"secret"})


def test_a_removed_character_next_to_a_secret_still_bounds_it() -> None:
    # the original reads the zero-width space as a break; its folded copy would not
    text = "word\u200bAKIAIOSFODNN7EXAMPLE"
    assert ALL.redact(text) == ("word\u200b[REDACTED:secret]", {"secret"})


@pytest.mark.parametrize("text", [
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",  # Japanese
    "\u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
    "caf\u00e9 \u2014 \u201cquoted\u201d \u00bd, na\u00efve \U0001f44d\u200d",
    "r\u00e9f\u00e9rence \u2116 2024\u2011000123",
])
def test_non_ascii_text_hiding_nothing_passes_untouched(text: str) -> None:
    assert ALL.redact(text) == (text, set())


def test_an_ascii_text_is_not_folded() -> None:
    assert fold("key AKIAIOSFODNN7EXAMPLE, all ASCII") is None
    assert fold("\u65e5\u672c") is None  # nothing in it folds: no copy either
