"""Replace PII and secrets in a prompt with typed placeholders (`<EMAIL>`, ...).

Each kind is found by a kept library, never by a hand-written pattern:
- emails, payment cards (Luhn), IBANs (checksum), IP addresses: presidio's
  pattern recognizers, which need no spaCy model. Its email check splits the
  domain with tldextract; here tldextract reads its bundled suffix list only
  (its default would fetch the list over the network).
- phone numbers: `phonenumbers.PhoneNumberMatcher` (valid numbers only).
- API keys and tokens: detect-secrets' detectors (AWS, GitHub, Slack, Stripe,
  JWT, private keys, `password = ...`, ...), and any word that detect-secrets'
  own Shannon entropy rates above its base64 or hex limit (high-entropy
  secrets such as bearer tokens).

What those libraries miss has a pattern of its own here (`PATTERNS`): the
value of an unquoted `NAME=value` or shell `export NAME=value` whose name
says it is secret, key formats by their prefix (`sk-`, `ghp_`, `xox?-`,
`AKIA`, JWTs), and national ID numbers (US SSN, UK NINO, Brazil CPF).

Building a `Scrubber` imports presidio (and through it spaCy's code, not a
model): seconds. It is built, and it scrubs, only in the capture stage's
scrubbing process (`worker.py`), never in the gateway's.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# One placeholder per kind; a find is replaced by the placeholder of its kind.
PLACEHOLDERS = {"EMAIL_ADDRESS": "<EMAIL>", "CREDIT_CARD": "<CARD>", "IBAN_CODE": "<IBAN>",
                "IP_ADDRESS": "<IP>", "PHONE": "<PHONE>", "SECRET": "<SECRET>", "NATIONAL_ID": "<ID>"}
SECRET_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PWD|CREDENTIALS?|AUTH)[A-Za-z0-9_]*"
# (kind, pattern): the find is group "v" when the pattern has one, else the whole match
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("SECRET", re.compile(rf"(?i)(?:\bexport\s+)?\b{SECRET_NAME}\s*[=:]\s*(?P<v>[^\s'\"]{{4,}})")),
    ("SECRET", re.compile(r"\b(?:sk|pk|rk)-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_\-]{16,}")),  # OpenAI, Anthropic, Stripe
    ("SECRET", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b")),  # GitHub
    ("SECRET", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}")),  # Slack
    ("SECRET", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),  # AWS access key ids
    ("SECRET", re.compile(r"\beyJ[A-Za-z0-9_\-]+\.eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+")),  # JWT
    ("NATIONAL_ID", re.compile(r"\b(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}\b")),  # US SSN
    ("NATIONAL_ID", re.compile(r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
                              r" ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")),  # UK National Insurance number
    ("NATIONAL_ID", re.compile(r"\b\d{3}\.\d{3}\.\d{3}-\d{2}\b")),  # Brazil CPF
]
# Candidate words for the entropy test: long runs of base64/url-safe/hex characters.
WORD = re.compile(r"[A-Za-z0-9+/=_\-]{20,}")
HEX = frozenset(string.hexdigits)


@dataclass(frozen=True)
class Find:
    start: int
    end: int
    kind: str


class Scrubber:
    def __init__(self, phone_region: str = "US") -> None:
        import phonenumbers
        import tldextract
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString, HexHighEntropyString
        from presidio_analyzer.predefined_recognizers import (
            CreditCardRecognizer,
            EmailRecognizer,
            IbanRecognizer,
            IpRecognizer,
        )

        offline = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

        class OfflineEmailRecognizer(EmailRecognizer):
            def validate_result(self, pattern_text: str) -> bool:
                return bool(offline(pattern_text).suffix)

        self._phonenumbers = phonenumbers
        self.phone_region = phone_region
        self.recognizers: list[Any] = [OfflineEmailRecognizer(), CreditCardRecognizer(), IbanRecognizer(),
                                       IpRecognizer()]
        detectors: dict[str, Any] = get_mapping_from_secret_type_to_class()
        plugins: list[Any] = [detector() for detector in detectors.values()]
        self.patterns: list[re.Pattern[str]] = [p for plugin in plugins for p in getattr(plugin, "denylist", ())]
        self.lines = [plugin for plugin in plugins if not getattr(plugin, "denylist", ())]
        # detect-secrets' limits; the hex test applies to words of hex digits only, as in detect-secrets
        self.entropy = [(Base64HighEntropyString(), 4.5, None), (HexHighEntropyString(), 3.0, HEX)]

    def scrub(self, text: str) -> tuple[str, dict[str, int]]:
        """The text with every find replaced, and the count of finds per placeholder."""
        chosen: list[Find] = []
        for find in self._finds(text):
            if all(find.end <= kept.start or find.start >= kept.end for kept in chosen):
                chosen.append(find)
        counts: dict[str, int] = {}
        for find in sorted(chosen, key=lambda f: f.start, reverse=True):
            placeholder = PLACEHOLDERS[find.kind]
            text = text[:find.start] + placeholder + text[find.end:]
            counts[placeholder] = counts.get(placeholder, 0) + 1
        return text, counts

    def _finds(self, text: str) -> Iterator[Find]:
        """Every find, the most specific kinds first: an earlier find wins an overlap."""
        for recognizer in self.recognizers:
            for result in recognizer.analyze(text, recognizer.supported_entities, None):
                yield Find(result.start, result.end, result.entity_type)
        for kind, pattern in PATTERNS:
            for m in pattern.finditer(text):
                group = "v" if "v" in pattern.groupindex else 0
                yield Find(m.start(group), m.end(group), kind)
        for pattern in self.patterns:
            yield from (Find(m.start(), m.end(), "SECRET") for m in pattern.finditer(text) if m.end() > m.start())
        leniency = self._phonenumbers.Leniency.VALID
        for match in self._phonenumbers.PhoneNumberMatcher(text, self.phone_region, leniency=leniency):
            yield Find(match.start, match.end, "PHONE")
        yield from self._secrets(text)

    def _secrets(self, text: str) -> Iterator[Find]:
        offset = 0
        for number, line in enumerate(text.splitlines(keepends=True)):
            for plugin in self.lines:
                for secret in plugin.analyze_line(filename="prompt", line=line, line_number=number + 1):
                    value = secret.secret_value or ""
                    start = line.find(value) if value else -1
                    if start >= 0:
                        yield Find(offset + start, offset + start + len(value), "SECRET")
            offset += len(line)
        for match in WORD.finditer(text):
            word = match.group()
            if _mixed(word) and any(plugin.calculate_shannon_entropy(word) > limit for plugin, limit, charset
                                    in self.entropy if charset is None or charset.issuperset(word)):
                yield Find(match.start(), match.end(), "SECRET")


def _mixed(word: str) -> bool:
    """Letters and digits both: a key, not a long word of prose."""
    return any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
