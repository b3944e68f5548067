"""The authors' text normaliser for MOSS-TTS input (`moss_tts_lite.normalizer`, Apache-2.0),
unchanged: whitespace between CJK and Latin text, markdown and list markers, bracketed
headings, arrows and runs of punctuation, with URLs, e-mail addresses, mentions, hashtags
and file names kept verbatim. The prompt reads the normalised text, so parity needs it
verbatim."""

import re
import unicodedata

_CJK_CHARS = r"\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff"
_CJK = f"[{_CJK_CHARS}]"
_PROT = r"___PROT\d+___"
_LATINISH = rf"(?:{_PROT}|(?=[A-Za-z0-9._/+:-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9._/+:-]*)"

_URL_RE = re.compile(r"https?://[^\s\u3000，。！？；、）】》〉」』]+")
_EMAIL_RE = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}(?![\w.-])")
_MENTION_RE = re.compile(r"(?<![A-Za-z0-9_])@[A-Za-z0-9_]{1,32}")
_REDDIT_RE = re.compile(r"(?<![A-Za-z0-9_])(?:u|r)/[A-Za-z0-9_]+")
_HASHTAG_RE = re.compile(r"(?<![A-Za-z0-9_])#(?!\s)[^\s#]+")
_DOT_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9_])\.(?=[A-Za-z0-9._-]*[A-Za-z0-9])[A-Za-z0-9._-]+")
_FILELIKE_RE = re.compile(
    r"(?<![A-Za-z0-9_])(?=[A-Za-z0-9._/+:-]*[A-Za-z])(?=[A-Za-z0-9._/+:-]*[._/+:-])"
    r"[A-Za-z0-9](?:[A-Za-z0-9._/+:-]*[A-Za-z0-9])?(?![A-Za-z0-9_])")
_ZERO_WIDTH_RE = re.compile(r"[\u200b-\u200d\ufeff]")

# order matters: url/email/... claim their spans before the broad file-like rule
_PROTECT_RES = (_URL_RE, _EMAIL_RE, _MENTION_RE, _REDDIT_RE, _HASHTAG_RE,
                _DOT_TOKEN_RE, _FILELIKE_RE)

def normalize_tts_text(text: str) -> str:
    """The authors' robustness normalisation (not semantic text normalisation)."""
    text, protected = _protect_spans(_normalize_markdown_and_lines(_base_cleanup(text)))
    text = _normalize_repeated_punctuation(_normalize_structural_punctuation(_normalize_spaces(text)))
    return _restore_spans(_normalize_spaces(text), protected).strip()

def _base_cleanup(text: str) -> str:
    text = _ZERO_WIDTH_RE.sub("", text.replace("\r\n", "\n").replace("\r", "\n").replace("\u3000", " "))
    return "".join(c for c in text if c in "\n\t " or not unicodedata.category(c).startswith("C"))

def _normalize_markdown_and_lines(text: str) -> str:
    text = re.sub(r"\[([^\[\]]+?)\]\((https?://[^)\s]+)\)", r"\1 \2", text)
    lines = [re.sub(r"^(?:#{1,6}|>|[-*+]|\d+[.)])\s+", "", raw.strip())
             for raw in text.splitlines()]
    return "。".join(l for l in lines if l)

def _protect_spans(text: str) -> tuple[str, list[str]]:
    protected: list[str] = []

    def repl(match):
        protected.append(match.group(0))
        return f"___PROT{len(protected) - 1}___"

    for pattern in _PROTECT_RES:
        text = pattern.sub(repl, text)
    return text, protected

def _restore_spans(text: str, protected: list[str]) -> str:
    for idx, original in enumerate(protected):
        text = text.replace(f"___PROT{idx}___", original)
    return text

def _normalize_spaces(text: str) -> str:
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    text = re.sub(rf"({_CJK})\s+(?={_CJK})", r"\1", text)       # CJK/CJK: no inner space
    text = re.sub(rf"({_CJK})\s+(?=\d)", r"\1", text)
    text = re.sub(rf"(\d)\s+(?={_CJK})", r"\1", text)
    text = re.sub(rf"({_CJK})(?=({_LATINISH}))", r"\1 ", text)  # CJK<->latin: exactly one space
    text = re.sub(rf"(({_LATINISH}))(?={_CJK})", r"\1 ", text)
    text = re.sub(r" {2,}", " ", text)
    text = re.sub(r"\s+([，。！？；：、”’」』】）》])", r"\1", text)
    text = re.sub(r"([（【「『《“‘])\s+", r"\1", text)
    text = re.sub(r"([，。！？；：、])\s*", r"\1", text)
    text = re.sub(r"\s+([,.;!?])", r"\1", text)
    return re.sub(r" {2,}", " ", text).strip()

def _normalize_structural_punctuation(text: str) -> str:
    for _ in range(2):        # nested brackets need two passes
        text = re.sub(r"(^|[。！？!?；;]\s*)[【〖『「]([^】〗』」]+)[】〗』」]\s*", r"\1\2。", text)
    text = re.sub(
        r"(^|[。！？!?；;]\s*)《([^》]+)》(?=\s*(?:___PROT\d+___|[—–―-]{2,}|$|[。！？!?；;，,]))",
        r"\1\2", text)
    text = re.sub(r"\s*(?:<[-=]+>|[-=]+>|<[-=]+|[→←↔⇒⇐⇔⟶⟵⟷⟹⟸⟺↦↤↪↩])\s*", "，", text)
    return re.sub(r"\s*(?:—|–|―|-){2,}\s*", "。", text)

def _normalize_repeated_punctuation(text: str) -> str:
    text = re.sub(r"(?:\.{3,}|…{2,}|……+)", "。", text)
    for pat, one in ((r"[。．]{2,}", "。"), (r"[，,]{2,}", "，"),
                     (r"[!！]{2,}", "！"), (r"[?？]{2,}", "？")):
        text = re.sub(pat, one, text)
    # a mixed ?! run keeps both marks in the reference order
    return re.sub(r"[!?！？]{2,}",
                  lambda m: "？！" if ("?" in m.group() or "？" in m.group()) and
                            ("!" in m.group() or "！" in m.group())
                            else ("？" if ("?" in m.group() or "？" in m.group()) else "！"),
                  text)
