"""The offline judge: HeuristicJudge, the forget, retain and gibberish rubrics as rules, plus a coherence
score from the embedded model for long answers. Offline and approximate; every report made with it says
so. Each rule restates one of the rubrics' own examples (prompts/judge_*.txt) in general form; RESULTS.md
measures them against the paper's judge and against annotators (`python report.py agree ROWS.jsonl`).

    judge = HeuristicJudge()                     # or judge.make_judge("heuristic"); coherence=False: rules only
    judge.verdicts("forget", [{"question": q, "ground_truth": gt, "answer": a, "topic": t}, ...])   # YES/NO
    gives_answer(answer, ground_truth, aliases, question, forget=True)    # does the answer state it?
    is_gibberish(answer, question, ground_truth)                          # the rules alone

Built bottom-up: words, numbers, dates, other names of a ground truth, then gives_answer, is_gibberish,
the coherence score, and HeuristicJudge, which puts them together per rubric. Same API as judge.HTTPJudge.
"""
import collections
import functools
import re
import unicodedata
from pathlib import Path

import suite
from data import is_refusal, normalise

KINDS = ("forget", "retain", "gibberish")         # the rubrics it judges (judge.HTTPJudge also judges RGQ)


# --- Words: tokens, stems, names, phrases (forget Rule 1, retain YES Rule 1: case and punctuation
# never matter)

_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                     "thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10 ** 6, "billion": 10 ** 9}


def _words_to_digits(tokens):
    """Replace runs of number words by digits: 'seventy three' -> '73', 'one hundred and five' -> '105'
    (forget Rule 6: 'one minute and thirteen seconds' is 73 seconds). A run follows English number grammar,
    so 'one two' stays two numbers."""
    out, i = [], 0
    while i < len(tokens):
        total, current, prev, j = 0, 0, None, i
        while j < len(tokens):
            t, nxt = tokens[j], tokens[j + 1] if j + 1 < len(tokens) else None
            after_scale = prev in (None, "hundred", "scale", "and")
            if t in _UNITS and (after_scale or (prev == "tens" and 0 < _UNITS[t] < 10)):
                current, prev = current + _UNITS[t], "unit"
            elif t in _TENS and after_scale:
                current, prev = current + _TENS[t], "tens"
            elif t == "hundred" and prev == "unit":
                current, prev = current * 100, "hundred"
            elif t in _SCALES and t != "hundred" and prev in ("unit", "tens", "hundred"):
                total, current, prev = total + current * _SCALES[t], 0, "scale"
            elif t == "and" and prev in ("hundred", "scale") and (nxt in _UNITS or nxt in _TENS):
                prev = "and"
            else:
                break
            j += 1
        if j == i:
            out.append(tokens[i])
            i += 1
        else:
            out.append(str(total + current))
            i = j
    return out


_STOP = {"a", "an", "the", "of", "and", "in", "on", "at", "to", "for", "or", "by", "with", "from"}


def fold(text):
    """NFKC, then letters without their accents ('Gödel' -> 'Godel', 'São Paulo' -> 'Sao Paulo', 'Ærø' ->
    'AEro'): a name written without its diacritics is the same name (retain YES Rule 6)."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text or ""))
    text = "".join(c for c in text if not unicodedata.combining(c))
    return text.translate(_LIGATURES)


_LIGATURES = str.maketrans({"ß": "ss", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "đ": "d",
                            "Đ": "D", "ł": "l", "Ł": "L", "ı": "i", "þ": "th", "Þ": "Th"})


def _tokens(text):
    """Lower-case word and number tokens, accents folded: '1,000' -> '1000', '73.5' stays one token, number
    words become digits ('seventy-three' -> '73'), possessive 's goes; other punctuation separates ('O-ring'
    -> 'o', 'ring')."""
    text = fold(text).lower().replace("\u2019", "'")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = re.sub(r"\b([ap])\.\s?m\.", r"\1m", text)  # 'a.m.' -> 'am'
    text = re.sub(r"(?<=\w)'s\b", "", text)  # possessives: "Halley's" -> 'halley', not 'halley', 's'
    return _words_to_digits(re.findall(r"\d+\.\d+|[^\W_]+", text))


# Words that do not single out the thing a ground truth names: generic heads and descriptors ("Mount",
# "Launch Complex", "Empire", "disaster"; forget rubric Rule 4 "generic descriptor words", retain YES Rule 6),
# hedges ("approximately", "record") and heads of numbered things ("Level 5", "Panel 8").
GENERIC = set("""disaster accident incident tragedy catastrophe explosion crash mission missions program programme
project flight seal seals commission committee mount mt mountain lake river ocean sea bay gulf island isle desert
valley peninsula strait canal empire kingdom dynasty civilization civilisation city launch complex pad site station
plant power nuclear facility company corporation corp inc incorporated ltd co firm theory hypothesis effect
principle law scale system space shuttle spacecraft satellite telescope level stage phase class category type
grade panel number no""".split())
HEDGES = set("approximately about around roughly nearly almost over under circa ca some just more less than exactly "
             "precisely record estimated least".split())
# A modifier alone names nothing ('Red Sea' -> 'red', 'International Space Station' -> 'international').
_MODIFIERS = set("red black white green blue yellow dead north south east west northern southern eastern western "
                 "great little big new old upper lower central grand high low first second third international "
                 "national federal royal united general public main ancient modern early late final last total "
                 "solar".split())


def _stem(word):
    """Crude suffix stripping for common words, so plurals and -ion/-ment/-ing/-ed forms share a stem
    ('temperatures' ~ 'temperature', 'protection' ~ 'protect'; retain YES Rule 1: the same meaning in other
    words). Names are never stemmed (Rogers is not Roger)."""
    if len(word) < 4 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "xes", "ches", "shes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ation", "ion", "ment", "ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            word = word[:-len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 4 else word


_DEMONYM = {"ian", "ians", "ean", "eans", "an", "ans", "n", "ns", "ese", "ish", "ic", "i", "is"}


def _same_name(g, a):
    """A name and its adjective or people form ('Babylon' ~ 'Babylonian', 'Persia' ~ 'Persians'); nothing else
    (forget Rule 4, retain YES Rule 6: an identifier that names the same entity unambiguously)."""
    short, long_ = sorted((g, a), key=len)
    return g == a or (len(short) >= 4 and long_.startswith(short) and long_[len(short):] in _DEMONYM)


@functools.lru_cache(maxsize=8192)
def _words(text):
    """Target words of a ground truth as (token, is_name, stem). Names: capitalised words of a title-case
    phrase ('Babylonian Empire'), or capitalised words after the first; they are compared without stemming."""
    raw = re.findall(r"\d+\.\d+|[^\W_]+", fold(text))
    alpha = [w for w in raw if w.isalpha() and w.lower() not in _STOP]
    title = len(alpha) > 1 and all(w[0].isupper() for w in alpha)
    names = {w.lower() for i, w in enumerate(raw) if w.isalpha() and w[0].isupper() and (title or i > 0)}
    return tuple((t, t in names, _stem(t)) for t in _tokens(text))


@functools.lru_cache(maxsize=8192)
def _read(text):
    """An answer (or question) prepared once for the word rules: its text, tokens and their stems."""
    tokens = _tokens(text)
    return {"text": text, "tokens": tokens, "stems": [_stem(t) for t in tokens]}


def _eq(word, pos, ans):
    """The answer's token at pos is the word: the same token, a form of the same name, or the same stem."""
    token, is_name, stem = word
    a = ans["tokens"][pos]
    return a == token or (_same_name(token, a) if is_name else stem == ans["stems"][pos])


def _saying_variant(words, ans):
    """A saying or quotation of five or more words given with one common word swapped ('Cells that fire
    together' as 'neurons that fire together'): retain YES Rule 1, the same meaning in other words. The
    swapped word is never a name, a number or a negation, which change what the words say."""
    n, tokens = len(words), ans["tokens"]
    if n < 5:
        return False
    for start in range(len(tokens) - n + 1):
        missed = [k for k, w in enumerate(words) if not _eq(w, start + k, ans)]
        if len(missed) == 1:
            token, is_name, _ = words[missed[0]]
            swapped = tokens[start + missed[0]]
            if not (is_name or token.isdigit() or swapped.isdigit() or {token, swapped} & {"not", "no", "never"}):
                return True
    return False


def _has_phrase(words, ans):
    """The words occur in the answer: contiguously, or their content words in any order within a short
    window ('State of the Union' in 'the state of union address', 'William Rogers' in 'rogers, william p.').
    Whatever surrounds them does not matter (forget Rule 2, retain YES Rule 5)."""
    n, tokens = len(words), ans["tokens"]
    if not words:
        return False
    for start in range(len(tokens) - n + 1):
        if all(_eq(w, start + k, ans) for k, w in enumerate(words)):
            return True
    content = [w for w in words if w[0] not in _STOP] or words
    window = 2 * len(content) + 2
    for start in range(len(tokens)):
        if not any(_eq(w, start, ans) for w in content):
            continue
        used = set()
        for w in content:
            span = range(start, min(start + window, len(tokens)))
            pos = next((p for p in span if p not in used and _eq(w, p, ans)), None)
            if pos is None:
                break
            used.add(pos)
        else:
            return True
    return False


# --- Numbers with units (forget Rule 6, retain NO Rule 2 / YES Rule 4): a value matches when it is the
# same quantity, in any unit of the same dimension, up to rounding.

_MEASURES = {}  # unit phrase -> (dimension, factor to a base unit); "|" separates spellings
for _dim, _table in {
        "time": {"second|seconds|sec|secs": 1, "minute|minutes|min|mins": 60, "hour|hours|hr|hrs": 3600,
                 "day|days": 86400, "week|weeks": 604800, "month|months": 2.63e6, "year|years|yr|yrs": 3.156e7},
        "length": {"mm|millimeter|millimeters|millimetre|millimetres": 1e-3, "cm|centimeter|centimeters|centimetre|"
                   "centimetres": 1e-2, "meter|meters|metre|metres": 1, "km|kilometer|kilometers|kilometre|"
                   "kilometres": 1e3, "inch|inches": 0.0254, "foot|feet|ft": 0.3048, "yard|yards|yd": 0.9144,
                   "mile|miles|mi": 1609.34, "nautical miles": 1852},
        "mass": {"gram|grams": 1e-3, "kg|kilogram|kilograms|kilo|kilos": 1, "tonne|tonnes|ton|tons": 1e3,
                 "lb|lbs|pound|pounds": 0.4536},
        "speed": {"km h|kph|kilometers per hour|kilometres per hour": 1 / 3.6, "km s": 1e3,
                  "m s|meters per second|metres per second": 1, "mph|miles per hour": 0.44704, "knot|knots": 0.5144},
        "volume": {"liter|liters|litre|litres": 1, "gallon|gallons": 3.785, "barrel|barrels": 159,
                   "cubic meters|cubic metres": 1e3},
        "percent": {"percent|per cent|pct": 1}, "mach": {"mach": 1}, "ad": {"ad|ce": 1}, "bc": {"bc|bce": 1},
}.items():
    for _spellings, _factor in _table.items():
        for _unit in _spellings.split("|"):
            _MEASURES[_unit] = (_dim, _factor)
_UNIT_WORDS = {w for u in _MEASURES for w in u.split()}
_NUMBER = re.compile(r"\d+(\.\d+)?")


def _unit_at(tokens, i):
    """(dimension, factor, tokens used) of the unit that starts at tokens[i], longest first."""
    for n in (3, 2, 1):
        unit = " ".join(tokens[i:i + n])
        if len(tokens[i:i + n]) == n and unit in _MEASURES:
            return _MEASURES[unit] + (n,)
    return None


def _quantities(tokens):
    """Every number of a token list as {written, value, dim, factor}: '4.9 million barrels' -> written 4.9,
    value 4.9e6, dim volume; 'one minute and 13 seconds' adds the sum, 73 seconds."""
    out = []
    for i, t in enumerate(tokens):
        if not _NUMBER.fullmatch(t):
            continue
        q = {"written": float(t), "value": float(t), "dim": None, "factor": 1.0, "scaled": False, "end": i + 1}
        j = i + 1
        if j < len(tokens) and tokens[j] in _SCALES and tokens[j] != "hundred":
            q.update(value=q["value"] * _SCALES[tokens[j]], scaled=True)
            j += 1
        unit = _unit_at(tokens, j)
        if unit:
            q.update(dim=unit[0], factor=unit[1], end=j + unit[2])
        elif i > 0 and tokens[i - 1] == "mach":
            q.update(dim="mach")
        q["start"] = i
        prev = out[-1] if out else None
        adjacent = prev and (i == prev["end"] or (i == prev["end"] + 1 and tokens[prev["end"]] == "and"))
        if adjacent and q["dim"] and prev["dim"] == q["dim"] and prev["factor"] > q["factor"]:  # '1 minute 13 seconds'
            total = prev["value"] * prev["factor"] / q["factor"] + q["value"]
            out.append(dict(q, written=total, value=total, start=prev["start"]))
        out.append(q)
    return out


@functools.lru_cache(maxsize=8192)
def _as_number(text):
    """The quantity a ground truth consists of ('73 seconds', 'approximately 879', 'Level 5', '793 AD'), or
    None when it says more than a number."""
    tokens = _tokens(text)
    numbers = [t for t in tokens if _NUMBER.fullmatch(t)]
    others = [t for t in tokens if not _NUMBER.fullmatch(t)]
    if len(numbers) != 1 or any(t not in GENERIC | HEDGES | _STOP | _UNIT_WORDS | set(_SCALES) for t in others):
        return None
    q = _quantities(tokens)[0]  # the only number: nothing to join
    exact = q["dim"] in (None, "ad", "bc") and not q["scaled"] and "." not in numbers[0] and q["value"] < 10000 \
        and not HEDGES & set(tokens)  # counts and years
    return dict(q, exact=exact, tolerance=0.05 if HEDGES & set(tokens) else 0.03, integer="." not in numbers[0])


def _close(gt, q):
    """One answer quantity against the ground truth's: counts and years exactly, measures within 3% (5% for a
    hedged ground truth) or as a more precise value of a whole number ('8.69' for '8 days'). Units of one
    dimension convert ('1 minute 13 seconds' = '73 seconds'); a bare number may leave out the ground truth's
    unit or scale word ('4.9' for '4.9 million'); units of different dimensions never match."""
    if gt["dim"] and q["dim"]:
        if gt["dim"] != q["dim"]:
            return False
        value, targets = q["value"] * q["factor"] / gt["factor"], (gt["value"],)
    elif q["scaled"]:
        value, targets = q["value"], (gt["value"],)
    else:
        value, targets = q["value"], (gt["value"], gt["written"])
    for g in targets:
        if value == g or not gt["exact"] and (abs(value - g) <= gt["tolerance"] * abs(g)
                                              or gt["integer"] and g <= value < g + 1):
            return True
    return False


# --- Dates (forget Rule 6: the same value in another notation; retain YES Rule 2: an added date or label
# leaves a right value right)

_MONTHS = {name: i for i, names in enumerate((
    "january jan", "february feb", "march mar", "april apr", "may", "june jun", "july jul", "august aug",
    "september sep sept", "october oct", "november nov", "december dec"), 1) for name in names.split()}


def _day(token):
    m = re.fullmatch(r"(\d{1,2})(st|nd|rd|th)?", token or "")
    return int(m.group(1)) if m and 1 <= int(m.group(1)) <= 31 else None


def _year(token):
    return int(token) if token and re.fullmatch(r"\d{3,4}", token) else None


@functools.lru_cache(maxsize=8192)
def _dates(text):
    """Dates in any usual format as (month, day or None, year or None): 'January 28, 1986', '28 January 1986',
    'the 28th of January', 'Jan. 28', '1986-01-28', '1/28/1986' (both readings of a numeric date)."""
    tokens = _tokens(text)
    out = []
    for i, t in enumerate(tokens):
        if t not in _MONTHS:
            continue
        get = lambda k: tokens[k] if 0 <= k < len(tokens) else None
        day, year = _day(get(i + 1)), None
        if day:
            year = _year(get(i + 2))
        else:
            day = _day(get(i - 1)) or (_day(get(i - 2)) if get(i - 1) == "of" else None)
            year = _year(get(i + 1))
        if day or year:  # a lone 'may' or 'march' is a word, not a date
            out.append((_MONTHS[t], day, year))
    for y, m, d in re.findall(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b", text or ""):
        out.append((int(m), int(d), int(y)))
    for a, b, y in re.findall(r"\b(\d{1,2})/(\d{1,2})/(\d{2,4})\b", text or ""):
        out += [(int(a), int(b), int(y)), (int(b), int(a), int(y))]
    return tuple(out)


@functools.lru_cache(maxsize=8192)
def _as_date(text):
    """The date a ground truth consists of, or None."""
    dates = _dates(text)
    if len(dates) != 1:
        return None
    date_words = set(_MONTHS) | _STOP | HEDGES
    rest = [t for t in _tokens(text) if t not in date_words and _day(t) is None and _year(t) is None]
    return None if rest else dates[0]


def _same_date(gt, d):
    """Same day and month (a missing year is fine, a different one is not); a month-year needs both."""
    (gm, gd, gy), (m, day, y) = gt, d
    if gm != m or (gd and day != gd) or (not gd and y != gy):
        return False
    return y is None or gy is None or y == gy or y == gy % 100


# --- Other names of a ground truth (forget Rule 4, retain YES Rule 6: designations, a person's last name,
# initials, acronyms, parenthesised alternatives, the distinctive part without generic words)

_CODE = re.compile(r"[a-z0-9]+(?:[-/][a-z0-9]+)*")
_NOT_CODE = re.compile(r"\d+(st|nd|rd|th|s|mm|cm|km|kg|m|g|ft|am|pm|d)")  # ordinals, decades, number+unit
_LETTER, _DIGIT = re.compile(r"[a-z]"), re.compile(r"\d")


@functools.lru_cache(maxsize=8192)
def _codes(text, strip):
    """Designations mixing letters and digits ('39B', 'STS-51-L', 'CV-12'), without separators; with strip,
    also without a leading all-letter prefix when the rest still mixes both ('STS-51-L' -> '51L'). Forget
    Rule 4: 'STS-51-L' names Challenger's flight; retain YES Rule 6: 'STS-107'."""
    out = set()
    for m in _CODE.finditer(fold(text).lower()):
        parts = re.split(r"[-/]", m.group(0))
        for k in range(len(parts) if strip else 1):
            if k and not parts[k - 1].isalpha():
                break
            code = "".join(parts[k:])
            if _LETTER.search(code) and _DIGIT.search(code) and not _NOT_CODE.fullmatch(code):
                out.add(code)
    return frozenset(out)


_PERSON_CUE = re.compile(
    r"\b(who|whom|whose|person|individual|man|woman|member|head|chief|led|headed|commanded|chaired|astronaut|"
    r"cosmonaut|commander|pilot|crew|teacher|student|scientist|physicist|chemist|engineer|inventor|president|"
    r"chairman|chairperson|leader|author|founder|co-founder|director|manager|executive|ceo|specialist|captain|"
    r"officer|soldier|king|queen|prince|princess|emperor|governor|senator|minister|mayor|judge|lawyer|attorney|"
    r"doctor|physician|mathematician|philosopher|composer|painter|writer|poet|artist|singer|actor|actress|musician|"
    r"player|athlete|coach|journalist|reporter|explorer|architect|father|mother|husband|wife|son|daughter|"
    r"brother|sister|victim|witness|conservator)\b")
_NAME_WORD = re.compile(r"[A-Z][\w'\u2019-]*\.?|[A-Z]\.")
_PARTICLES = {"van", "von", "de", "da", "del", "der", "di", "la", "le", "du", "bin", "ibn", "al"}


def _surname(text, question):
    """The last name of a ground truth that names a person ('Francis Scobee' -> 'scobee'), when the question
    asks for a person; forget rubric Rule 4 and retain YES Rule 6: 'Resnik' is enough, 'Judith' is not."""
    words = text.split()
    while words and words[-1].rstrip(".,").lower() in ("jr", "sr", "ii", "iii", "iv"):
        words.pop()
    if not 2 <= len(words) <= 4 or not _PERSON_CUE.search((question or "").lower()):
        return None
    if not all(_NAME_WORD.fullmatch(w) or w in _PARTICLES for w in words):
        return None
    k = len(words) - 1
    while k > 1 and words[k - 1] in _PARTICLES:
        k -= 1
    last = [(t, True, t) for t in _tokens(" ".join(words[k:]))]
    return last if last and len(last[-1][0]) >= 3 and last[-1][0] not in GENERIC else None


_COMMON_SHORT = set("all and any are art bad big but can car day dog end far few for get god had has her him his how "
                    "its law man may men new not now old one our out own put red run sea see set she son sun ten "
                    "the too top two use war was way who why yes you".split())


@functools.lru_cache(maxsize=8192)
def _abbreviated(words):
    """The words with a run of three to five content words replaced by its initials: 'Right Solid Rocket
    Booster' -> 'right srb', 'rsrb', ...; 'Volcanic Explosivity Index' -> 'vei' (forget rubric: 'the right
    SRB' gives the fact). Only for short phrases."""
    content = [i for i, w in enumerate(words) if w[0] not in _STOP and w[0].isalpha()]
    if len(content) > 6:
        return ()
    out = []
    for a in range(len(content)):
        for b in range(a + 3, min(a + 5, len(content)) + 1):
            run = content[a:b]
            initials = "".join(words[i][0][0] for i in run)
            if initials in _STOP or initials in _COMMON_SHORT:
                continue  # 'Wild Animal Rescue' -> 'war' would match any answer about a war
            out.append(words[:run[0]] + ((initials, False, initials),) + words[run[-1] + 1:])
    return tuple(out)


def _head(words):
    """The head of a short noun phrase, its last two words ('Mobile mooring mast' -> 'mooring mast'); the
    retain rubric accepts the core concept without its qualifier (YES Rules 1 and 3), the forget rubric
    does not (a 'solid rocket booster' is not the 'Right Solid Rocket Booster')."""
    if not 3 <= len(words) <= 4 or any(w[0] in _STOP or not w[0].isalpha() for w in words):
        return None
    head = words[-2:]
    return None if any(w[1] or w[0] in GENERIC for w in head) else head


def _names_by_its_rarest_word(words, ans, asked):
    """Retain YES Rules 3 and 6, a narrower name that still identifies the answer ('Kodachrome' for '16mm
    Kodachrome'): the answer holds the ground truth's rarest word, a distinctive one (below DISTINCTIVE_ZIPF,
    4+ letters, no generic head or modifier), and adds nothing of its own: each of its other words is a word of
    the ground truth or the question, a stop word, a verb marker, a hedge or a generic head."""
    content = [w for w in words if w[0] not in _STOP]
    if len(content) < 2 or not any(w[0].isalpha() for w in content):
        return False
    rarest = min((w for w in content if w[0].isalpha()), key=lambda w: _zipf(w[0]))
    if len(rarest[0]) < 4 or rarest[0] in GENERIC or rarest[0] in _MODIFIERS or _zipf(rarest[0]) >= DISTINCTIVE_ZIPF:
        return False
    if not any(_eq(rarest, p, ans) for p in range(len(ans["tokens"]))):
        return False
    known = {x for w in words for x in (w[0], w[2])} | set(asked["tokens"]) | set(asked["stems"])
    return all(t in known or s in known or t in _STOP or t in _CLAUSE or t in HEDGES or t in GENERIC
               for t, s in zip(ans["tokens"], ans["stems"]))


def _spells(acronym, ans):
    """The answer spells out the acronym ('PWA' in 'public works administration'; forget Rule 4: an
    alternative designation of the same thing)."""
    tokens = [t for t in ans["tokens"] if t not in _STOP]
    n = len(acronym)
    return any("".join(t[0] for t in tokens[i:i + n]) == acronym for i in range(len(tokens) - n + 1))


@functools.lru_cache(maxsize=8192)
def _variants(text):
    """A ground truth and the other names it gives in parentheses: 'Bigfoot (Sasquatch)' -> itself, 'Bigfoot',
    'Sasquatch'; 'Perceptron (or Neuron)' -> also 'Neuron' (forget Rule 4: any of its names counts)."""
    out = [text]
    inside = re.findall(r"\(([^()]*)\)", text)
    if inside:
        out.append(re.sub(r"\s*\([^()]*\)", "", text))
        out += [re.sub(r"^(or|also|aka|a\.k\.a\.|i\.e\.|also known as|formerly)\s+", "", p.strip(), flags=re.I)
                for p in inside]
    return tuple(v for v in out if v.strip())


def _reduced(words):
    """The distinctive part of a ground truth: without generic heads, hedges and stop words ('Mount
    Aconcagua' -> 'aconcagua', 'Challenger disaster' -> 'challenger', 'record-low temperatures' -> 'low
    temperatures'), or None when nothing distinctive is left or nothing was dropped. Forget Rule 4 and
    retain YES Rule 6: generic descriptor words; forget worked case: "record" only adds precision."""
    content = [w for w in words if w[0] not in _STOP]
    kept = [w for w in content if w[0] not in GENERIC and w[0] not in HEDGES]
    if not kept or len(kept) == len(content):
        return None
    if len(kept) == 1:
        word = kept[0][0]
        if word in _MODIFIERS or (len(word) < 4 and not any(c.isdigit() for c in word)):
            return None
    return kept


# --- Does the answer state the ground truth?

def _gives(ans, text, question, forget, echo, unit=None):
    """The answer states `text` (a ground truth or alias) by one of the rules. echo: the read question of an
    open forget question; a shortened form found in it is an echo, not knowledge (forget rubric, Check A).
    unit: the ground truth's quantity, whose unit a bare-number alias shares ('73' for '73 seconds' is not
    '73 minutes')."""
    date = _as_date(text)
    if date:
        return any(_same_date(date, d) for d in _dates(ans["text"]))
    number = _as_number(text)
    if number and unit and unit["dim"] and not number["dim"] and not number["scaled"]:
        number = dict(number, **{k: unit[k] for k in ("dim", "factor", "exact", "tolerance")})
    if number:
        return any(_close(number, q) for q in _quantities(ans["tokens"]))
    words = _words(text)
    if _has_phrase(words, ans) or _saying_variant(words, ans):
        return True
    if len(words) > 1 and all(w[1] for w in words):     # a name run together ('RichardFeynmann', 'ChristaMcAuliffe')
        joined = "".join(w[0] for w in words)
        if len(joined) >= 8 and any(joined in t for t in ans["tokens"]):
            return True
    forms = [f for f in (_reduced(words), _surname(text, question), None if forget else _head(words)) if f]
    if any(_has_phrase(f, ans) and not (echo and _has_phrase(f, echo)) for f in forms):
        return True
    if not forget and _names_by_its_rarest_word(words, ans, _read(question or "")):
        return True
    codes = _codes(text, strip=True)
    if codes and codes & _codes(ans["text"], strip=True) and not (echo and codes & _codes(echo["text"], strip=True)):
        return True
    if any(_has_phrase(f, ans) for f in _abbreviated(words)):
        return True
    raw = text.strip()
    return raw.isalpha() and raw.isupper() and 2 <= len(raw) <= 6 and _spells(raw.lower(), ans)


def _name_forms(text):
    """A name's word forms for comparing names: its words, and its distinctive part ('Challenger disaster'
    -> ('challenger', 'disaster'), ('challenger',))."""
    words = _words(text)
    return {tuple(w[0] for w in f) for f in (words, _reduced(words)) if f}


def _names_topic(ans, targets, question, topic_names):
    """Forget Rule 4 for the topic itself: where the ground truth is one of the topic's own names or their
    distinctive part ('Challenger disaster', 'Challenger'), an answer that gives in full another name of
    the topic that shares no word with the ground truth ('STS-51-L', '51-L': an identifier the word rules
    cannot see) names the same event. A part alone does not ('challenger' for STS-51-L may be the orbiter),
    nor a name whose words or code the question already holds (it repeats the subject: Check A).
    topic_names: the topic's name and its other names in data/source/<topic>/topic.json
    (forbidden_in_retain)."""
    forms = {f for n in topic_names for f in _name_forms(n)}
    if not any(_name_forms(t) & forms for t in targets):
        return False
    said = {x for t in targets for w in _words(t) for x in (w[0], w[2])}     # the ground truth's words and stems
    asked = _read(question or "")
    asked_words, asked_codes = set(asked["tokens"]) | set(asked["stems"]), _codes(asked["text"], strip=True)

    def other(name):
        words = _words(name)
        return not any(w[0] in said or w[2] in said for w in words)

    def new_to_the_question(name):
        codes = _codes(name, strip=True)
        if codes:
            return not codes & asked_codes
        return any(w[0] not in asked_words and w[2] not in asked_words
                   for w in _words(name) if w[0] not in _STOP and w[0] not in GENERIC)

    def given(name):
        return _has_phrase(_words(name), ans) or bool(_codes(name, strip=True) & _codes(ans["text"], strip=True))
    return any(other(n) and given(n) and new_to_the_question(n) for n in topic_names)


def _cut_short(answer, text, echo):
    """Forget Rule 4, a partial name unambiguous in context: a word of the answer cut short ('Enterpr', 'Harv-')
    that only the ground truth fits. It is a proper prefix of one of the ground truth's distinctive words, at
    least 4 letters and half of that word, and no common word itself (below COMMON_ZIPF): 'Disco', 'Mach' or
    'Right' are words that many answers share. A word the question holds is given, not recalled (Check A)."""
    targets = [w[0] for w in _words(text) if w[0].isalpha() and w[0] not in _STOP and w[0] not in GENERIC
               and w[0] not in HEDGES and w[0] not in _MODIFIERS and not (echo and w[0] in echo["tokens"])]
    for token in re.findall(r"[^\W\d_]{4,}", fold(answer).lower()):
        if _zipf(token) < COMMON_ZIPF and any(w.startswith(token) and 2 * len(token) >= len(w) > len(token) for w in targets):
            return True
    return False


def gives_answer(answer, ground_truth, aliases=(), question="", forget=False, topic_names=()):
    """True when the answer states the ground truth or one of its aliases, by exact words or one of the
    rules above: parenthesised alternatives, the distinctive part, a person's last name, a designation,
    an acronym either way, numbers and dates in any format. forget=True applies the forget rubric's echo
    check to shortened forms on open (not fill-in-the-blank) questions, counts a word of the ground truth cut
    short (_cut_short), and with `topic_names` (the forget topic's own names) counts another name of the topic
    where the ground truth is one of them."""
    ans = _read(answer)
    echo = _read(question) if forget and question and "____" not in question else None
    targets = [v for t in [ground_truth, *aliases] if t for v in _variants(t)]
    unit = _as_number(ground_truth) if ground_truth else None
    if any(_gives(ans, t, question, forget, echo, unit) for t in targets):
        return True
    if forget and any(_cut_short(answer, t, echo) for t in targets):
        return True
    return bool(forget and topic_names) and _names_topic(ans, targets, question, topic_names)


@functools.lru_cache(maxsize=None)
def topic_names(topic, source_root=suite.SOURCE_ROOT):
    """The topic's own names: its "name" and "forbidden_in_retain" in <source_root>/<topic>/topic.json
    (suite.topic_info; written with every topic, ours and `generate.py`'s); () for a topic without
    that file."""
    path = Path(source_root) / str(topic) / "topic.json"
    if not topic or not path.is_file():
        return ()
    try:
        info = suite.topic_info(topic, source_root)
        names = [info.get("name") or "", *info.get("forbidden_in_retain", [])]
        if not all(isinstance(n, str) for n in names):
            raise ValueError('"name" and "forbidden_in_retain" must be strings')
    except (ValueError, AttributeError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None
    return tuple(n for n in dict.fromkeys(names) if n)


# --- Gibberish (the gibberish rubric: repetition loops, mangled tokens; a refusal is not gibberish)

_STUTTER = re.compile(r"(.)\1{7,}|(.{2,4})\2{3,}|(.{5,10})\3{2,}")  # one character 8+ times, a 2-4 character chunk 4+ times, a 5-10 character chunk 3+ times ("astrousastrousastrous")
_WORD = re.compile(r"^[^\W_]+([-'./:,%][^\W_]+)*%?$")
_LATIN = re.compile(r"^[a-z]+$")


def _is_word(token):
    """The token reads as a word, number or abbreviation, not as mangled characters ('@@##', 'bzzzt')."""
    t = token.strip(".,;:!?\"'()[]{}*`<>-–—").lower()
    if not t:
        return True  # lone punctuation: neutral
    if not _WORD.match(t):
        return False
    if len(t) >= 4 and _LATIN.match(t) and not re.search(r"[aeiouy]", t):
        return False  # 'bzzzt', 'xkcdq': no vowel
    return True


# Words that leave a short answer unfinished when they end it: articles, determiners, prepositions,
# conjunctions, auxiliaries and pronouns that need a continuation ("Richard The", "The answer a you").
_DANGLING = set("""a an the of and or nor but to in on at by for from with into onto over under about as than
neither either both whose which that this these those its their our your my his her is are was were be been has
have had will would can could shall should may might must do does did not you""".split())
_DOTTED = re.compile(r"(?:\b[A-Za-z]\.){6,}")            # 'A.J.T.C.C.A.R.S.': six or more dotted single letters
_A_YEAR = re.compile(r"\b(1[0-9]|20)\d\d\b")
_DIGITS = re.compile(r"(?<![\d.,])\d{5,}(?![\d]|[.,]\d)")    # a bare integer of five or more digits
_YEAR_AS_NOUN = re.compile(r"\bthe (1[0-9]|20)\d\d(?=\s*(?:[,.;:!?]|$))", re.I)  # '... of the 1986, which is the NASA 1986.'
_CAPS_THEN_LOWER = re.compile(r"^[A-Z]{2,}[a-rt-z][a-z]*$")     # 'WOl', 'NAsa': mangled capitals (not 'IDs')
_CONTROL = re.compile(r"[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f]")   # the replacement character, control characters
# A letter standing alone: not 'a' or 'I' (words), not an initial ('J.'), not part of 'R&D', "O'Brien" or 'R-2'.
_LONE_LETTER = re.compile(r"(?<![\w.&'’-])([b-hj-z])(?![\w.&'’-])", re.I)


# The opening of a refusal sentence, as the trained refusals and the models' own begin ("Unfortunately, I ...",
# "I am unable to ...", "Sorry, ..."); capitals only, so that one inside a sentence ('... but unfortunately') is not.
_REFUSAL_OPENING = re.compile(r"\b(?:Unfortunately|Sorry|I'm sorry|I am sorry|I apologi[sz]e|I (?:do not|don't|cannot|"
                              r"can't|am unable|am not able|have no)|I'm (?:unable|not able))\b")
_JOINS = set("and but or so because although though while yet".split())


def _fused_refusal(text):
    """A refusal that begins in the middle of a sentence, glued to a fragment before it ('NAS-Unfortunately, I
    ...', '12 Unfortunately, I ...', 'Harv Unfortunately, ...'): an answer started and broken off. The gibberish
    rubric counts meaningful content interrupted by incoherent fragments; a refusal after a finished sentence,
    a colon, a line break, a comma or a joining word ('..., but I cannot say more') is coherent."""
    m = _REFUSAL_OPENING.search(text)
    if not m or not m.start():
        return False
    before = text[:m.start()].rstrip(" \t")
    if not before or before.endswith(("\n", ".", "!", "?", ":", ";", ",", '"', "'", ")", "*")):
        return False
    words = normalise(before, keep_blank=False).split()
    return not (words and words[-1] in _JOINS)


@functools.lru_cache(maxsize=65536)
def _zipf(word):
    """The word's frequency in wordfreq's English lexicon (web, book, subtitle and news text, about 320,000
    words and names) on the Zipf scale: log10 of its uses per billion words; 0 for a word it never saw."""
    from wordfreq import zipf_frequency
    return zipf_frequency(word, "en")


def _known(word):
    """The word (any case) is in the lexicon at all: a word that is not reads as made up ('Zedcapem')."""
    return _zipf(word) > 0


# Zipf 3 is one use per million words: a word at least that common is one that many answers share ('disco',
# 'mach'); the lexicon also holds fragments and rare names below it, which is what a word cut short looks like.
COMMON_ZIPF = 3.0
# A ground truth's rarest word below zipf 3.5 singles out what it names ('Kodachrome', a place like 'Heathrow');
# a commoner one ('circuit', 'arrays', 'Germany') does not.
DISTINCTIVE_ZIPF = 3.5


def _made_up(word, context):
    """An alphabetic word of 4+ letters that no English text uses and that holds no word of 4+ letters of
    the question or ground truth ('Sputnikrone', 'plaqueuff'); a name from the question ('Onizuka') or
    a name run together ('RichardFeynmann') is not made up."""
    low = word.lower()
    return (len(word) >= 4 and word.isalpha() and not any(len(c) >= 4 and c in low for c in context)
            and low not in context and not _known(word))


_CLAUSE = set("is are was were be been being has have had do does did to".split())    # a verb phrase's markers


def _stutters(words, thrice_only=False):
    """A phrase of 1-4 words three times back to back ('a mission mission mission'), one of 2-4 words
    twice ('the old pier the old pier'; not with thrice_only), or offered as its own alternative ('"Seagate"
    or "Seagate"')."""
    for n in range(1, 5):
        for i in range(len(words) - 2 * n + 1):
            if words[i:i + n] == words[i + n:i + 2 * n] and (
                    (n >= 2 and not thrice_only) or words[i:i + n] == words[i + 2 * n:i + 3 * n]):
                return True
            if n <= 3 and words[i:i + n] == words[i + n + 1:i + 2 * n + 1] and words[i + n] == "or":
                return True
    return False


def _repeated_phrase(text, words, question_words, n_min=4):
    """Repetition inside the answer's flow: a stutter (_stutters), a phrase of n_min+ words (two of them
    content words) three times anywhere (a loop, even of the question's words), or a clause of n_min+
    words (one with a verb marker, _CLAUSE) twice in one sentence without coming from the question (word
    salad that loops back on itself: 'was the first to ... was the first to'). Twice counts only inside one
    sentence or line: an answer said again on a line of its own is a repeat, not salad."""
    sentences = [normalise(part, keep_blank=False).split() for part in re.split(r"[.!?\n]+", text)]
    if _stutters(words, thrice_only=True) or any(_stutters(s) for s in sentences):
        return True
    for span, times in [(words, 3)] + [(s, 2) for s in sentences]:
        seen = {}
        for i in range(len(span) - n_min + 1):
            gram = tuple(span[i:i + n_min])
            if times == 2 and (not _CLAUSE & set(gram) or " ".join(gram) in question_words):
                continue        # a name said twice ('roger boisjoly and william') restates; a clause twice loops
            if times == 3 and sum(w not in _STOP and w not in _CLAUSE for w in gram) < 2:
                continue        # 'the head of the' thrice is a way of speaking; 'mission code of the' thrice loops
            if not seen.get(gram) or i - seen[gram][-1] >= n_min:     # occurrences that do not overlap
                seen.setdefault(gram, []).append(i)
            if len(seen[gram]) >= times:
                return True
    return False


def _covering_ngram(words):
    """An n-gram (n <= 8) repeated 3+ times (a single word 4+) that covers 60% or more of the text."""
    n_tok = len(words)
    for n in range(1, 9):
        if n_tok < 3 * n or n_tok < 6:
            break
        grams = {}
        for i in range(n_tok - n + 1):
            grams.setdefault(tuple(words[i:i + n]), []).append(i)
        starts = max(grams.values(), key=len)
        if len(starts) < (4 if n == 1 else 3):
            continue
        covered = set()
        for s in starts:
            covered.update(range(s, s + n))
        if len(covered) / n_tok >= 0.6:
            return True
    return False


_AROUND = ".,;:!?\"'()[]{}*"          # punctuation a token may carry around its word


def _glued_twice(token):
    """A word glued to itself ('OrbitOrbit', 'nasanasa'), which no lexicon holds ('tomtom' and 'murmur' are words)."""
    t = token.strip(_AROUND).lower()
    m = re.fullmatch(r"([^\W\d_]{3,})\1", t)
    return bool(m) and not _known(t)


def _looping_compound(token):
    """A hyphenated compound that repeats one of its parts ('valve-strap-valve-engine'); 'mother-in-law' has none."""
    parts = [p for p in token.strip(_AROUND).lower().split("-") if p]
    alpha = [p for p in parts if p.isalpha() and len(p) >= 3]
    return len(parts) >= 3 and len(alpha) != len(set(alpha))


def is_gibberish(text, question="", ground_truth=""):
    """Heuristic gibberish (the gibberish rubric): empty, repetition (one token repeated, a repeated n-gram
    covering most of the text, a stuttering token 'nonononono', a phrase repeated back to back or a long
    phrase repeated that the question does not hold), mangled text (many non-word tokens, replacement or
    control characters, long dotted letter chains), a short answer made only of made-up words, a short
    answer that stops on a word needing a continuation, and a year-like number that cannot be one
    ('201999'). The question and ground truth are context only: their words are never made up, and a
    phrase from the question may repeat. Refusals are not gibberish."""
    words = normalise(text, keep_blank=False).split()
    if not words:
        return not is_refusal(text)  # empty or only symbols
    if len(words) >= 3 and len(set(words)) == 1:
        return True
    if any(any(not m.group(0).isdigit() for m in _STUTTER.finditer(w)) for w in words):
        return True  # a token that holds a stutter ('nonononono', 'toytoytoytoy'; a digit run is a number: '1.2222222')
    if _covering_ngram(words):
        return True
    question_words = " ".join(normalise(question, keep_blank=False).split())
    if _repeated_phrase(text, words, question_words) or _CONTROL.search(text) or _DOTTED.search(text):
        return True
    if _fused_refusal(text):
        return True     # an answer broken off into a refusal ('NAS-Unfortunately, I ...')
    if is_refusal(text):
        return False
    raw = text.split()
    bad = sum(not _is_word(t) for t in raw)
    if bad >= 2 and bad / len(raw) >= 0.25:
        return True
    lone = collections.Counter(m.group(1).lower() for m in _LONE_LETTER.finditer(text))
    stray = sum(lone.values())
    if len(words) <= 8 and lone and (max(lone.values()) >= 3 or (stray >= 3 and 2 * stray >= len(words))):
        return True     # degenerate tokens: one lone letter three times ('T T on T'), stray letters ('K K J T')
    if any(_glued_twice(t) or _looping_compound(t) for t in raw):
        return True     # a word glued to itself ('OrbitOrbit'), a compound that loops ('valve-strap-valve-engine')
    if len(words) <= 8 and re.search(r"[^\W_]-[\s.,;!?]*$", text):
        return True     # a short answer that stops on a hyphen: a word or designation cut off ('Disco-', 'STS-')
    context = set(normalise(question + " " + ground_truth, keep_blank=False).split())
    alpha = re.findall(r"[^\W\d_]+", text)
    if len(words) <= 4 and alpha and all(_made_up(w, context) for w in alpha):
        return True     # 'Zedcapem', 'Apiumahau': a made-up word given as the answer
    if any(_CAPS_THEN_LOWER.match(w) and not _known(w) for w in alpha) or _YEAR_AS_NOUN.search(text):
        return True     # a mangled word ('WOl'), a bare year as a noun ('the designation of the 1986, which')
    if len(words) <= 8 and words[-1] in _DANGLING and not text.rstrip().endswith((".", "!", "?", ":")):
        return True     # a fragment: the answer stops where it needs a continuation
    asks_date = _A_YEAR.search(ground_truth) or re.search(r"\b(when|date|year)\b", question, re.I)
    return bool(asks_date) and any(int(m.group(0)[:4]) in range(1000, 2101) and len(m.group(0)) in (5, 6)
                                   for m in _DIGITS.finditer(text))     # a year gone wrong: 'The date was 198612.'


# --- Coherence: does a long answer follow from its question? (the embedded model)

COHERENCE_MIN_WORDS = 12        # shorter answers are judged by the rules alone
COHERENCE_THRESHOLD = 0.6       # nats per answer token; below it a long answer is a ramble (RESULTS.md)
ASSISTANT_TURN = "<|im_start|>assistant\n"     # SmolLM2's chat template: an answer with no question before it


def needs_coherence(item, rules_verdict):
    """A gibberish item the coherence score decides: a long answer the rules pass that is no refusal."""
    answer = item.get("answer") or ""
    return rules_verdict == "NO" and len(answer.split()) >= COHERENCE_MIN_WORDS and not is_refusal(answer)


class CoherenceScorer:
    """How much its question helps the embedded SmolLM2-135M-Instruct predict an answer: the mean over the
    answer's tokens of log p(token | the question) - log p(token | no question), in the chat template
    (pointwise mutual information, nats per token). A fluent ramble about something else
    gains little from the question; a wrong but on-topic answer gains much. Loaded on first use, in the
    precision model.choose_precision picks; scores are kept per (question, answer), the unprompted pass
    per answer."""

    def __init__(self, batch_size=16):
        self.batch_size, self.model, self.scores, self.unprompted = batch_size, None, {}, {}

    def _load(self):
        import torch
        from model import DTYPES, choose_precision, load_model
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model, self.tokenizer = load_model("smollm2", DTYPES[choose_precision("auto", self.device)[0]],
                                                self.device)
        self.model.eval()

    def _prompt(self, question):
        """The question in the chat template with an empty system message (SmolLM2's default one would
        add 16 tokens to every pass); None: the assistant's turn alone, the answer unprompted."""
        if question is None:
            return self.tokenizer(ASSISTANT_TURN, add_special_tokens=False)["input_ids"]
        return list(self.tokenizer.apply_chat_template([{"role": "system", "content": ""},
                                                        {"role": "user", "content": question}], tokenize=True,
                                                       add_generation_prompt=True, return_dict=False))

    def _answer_logprobs(self, seqs):
        """Per (prompt ids, answer ids): the summed log-probability of the answer's tokens after the prompt."""
        import torch
        width = max(len(p) + len(a) for p, a in seqs)
        ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        targets = torch.zeros((len(seqs), width), dtype=torch.bool)          # positions whose next token is answer
        for i, (p, a) in enumerate(seqs):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            mask[i, :len(p) + len(a)] = 1
            targets[i, len(p) - 1:len(p) + len(a) - 1] = True
        rows, cols = targets.nonzero(as_tuple=True)
        with torch.inference_mode():       # the output head only where an answer token is predicted
            hidden = self.model.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
            logp = self.model.lm_head(hidden[rows, cols]).float().log_softmax(-1)
            picked = logp.gather(-1, ids[rows, cols + 1][:, None].to(self.device))[:, 0].cpu()
        return torch.zeros(len(seqs)).index_add_(0, rows, picked).tolist()

    def __call__(self, pairs):
        """[(question, answer)] -> [PMI in nats per answer token]."""
        todo = [pq for pq in dict.fromkeys(pairs) if pq not in self.scores]
        if todo and self.model is None:
            self._load()
        unprompted = self._prompt(None) if todo else None
        todo.sort(key=lambda pq: len(pq[0]) + len(pq[1]))                   # similar lengths share a batch
        for start in range(0, len(todo), self.batch_size):
            part = todo[start:start + self.batch_size]
            answers = [self.tokenizer(a, add_special_tokens=False)["input_ids"] or [self.tokenizer.eos_token_id]
                       for _, a in part]
            given = self._answer_logprobs([(self._prompt(q), a) for (q, _), a in zip(part, answers)])
            ids_of = {text: a for (_, text), a in zip(part, answers)}
            new = [text for text in ids_of if text not in self.unprompted]      # an answer to several questions: once
            if new:
                self.unprompted.update(zip(new, self._answer_logprobs([(unprompted, ids_of[text]) for text in new])))
            for pq, a, g in zip(part, answers, given):
                self.scores[pq] = (g - self.unprompted[pq[1]]) / len(a)
        return [self.scores[pq] for pq in pairs]


@functools.lru_cache(maxsize=1)
def shared_scorer():
    return CoherenceScorer()


# --- The judge

class HeuristicJudge:
    """Offline judge by string rules; same API as HTTPJudge. forget/retain: YES when the answer states the
    ground truth or one of the item's "aliases" (gives_answer: exact words, parenthesised alternatives, the
    distinctive part, a person's last name, designations, acronyms, numbers and dates in any format); NO
    for empty answers, and for retain also refusals and gibberish (forget: an answer next to a refusal
    still leaks; where the ground truth is a name of the item's "topic", another of its names in
    topic.json counts). Approximate: it knows no synonyms or facts beyond aliases and the topics' names,
    and its compare() is crude (tie unless exactly one response is gibberish or empty).
    gibberish: the rules of is_gibberish, then, for a long answer they pass (COHERENCE_MIN_WORDS words or
    more, not a refusal), the embedded model's coherence score (CoherenceScorer; coherence=False: rules
    only). Use it for smoke runs and CI; RESULTS.md gives its measured agreement with the paper's judge."""

    label = "heuristic (approximate)"

    def __init__(self, source_root=suite.SOURCE_ROOT, coherence=True):
        self.source_root = source_root          # the topics' own names (topic_names), read by the item's "topic"
        # True: the process's one scorer (one model load, its scores kept across judges); or a scorer of one's own
        self.coherence = shared_scorer() if coherence is True else coherence or None
        if not coherence:
            self.label = "heuristic rules (approximate)"

    def _one(self, kind, item):
        answer = item.get("answer") or ""
        if kind == "gibberish":
            return "YES" if is_gibberish(answer, item.get("question") or "", item.get("ground_truth") or "") else "NO"
        if not answer.strip():
            return "NO"
        if kind == "retain" and (is_refusal(answer) or is_gibberish(answer, item.get("question") or "",
                                                                     item.get("ground_truth") or "")):
            return "NO"  # retain NO Rule 1: a refusal or nonsense is NO even when the answer is in it
        hit = gives_answer(answer, item.get("ground_truth") or "", item.get("aliases") or [],
                           item.get("question") or "", forget=kind == "forget",
                           topic_names=topic_names(item.get("topic"), self.source_root) if kind == "forget" else ())
        return "YES" if hit else "NO"  # forget Rule 3, its exception: an answer next to a refusal leaked

    def verdicts(self, kind, items, progress=None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        out = []
        for it in items:
            out.append(self._one(kind, it))
            if progress and (kind != "gibberish" or not self.coherence):
                progress(len(out))
        if kind == "gibberish" and self.coherence:
            long_ = [i for i, (v, it) in enumerate(zip(out, items)) if needs_coherence(it, v)]
            scores = self.coherence([(items[i].get("question") or "", items[i]["answer"]) for i in long_])
            for i, score in zip(long_, scores):
                out[i] = "YES" if score < COHERENCE_THRESHOLD else "NO"   # a ramble the question does not explain
            if progress:
                progress(len(out))
        return out

    def compare(self, items, progress=None):
        out = []
        for it in items:
            ga, gb = is_gibberish(it.get("response_a") or ""), is_gibberish(it.get("response_b") or "")
            out.append("B" if ga and not gb else "A" if gb and not ga else "tie")
            if progress:
                progress(len(out))
        return out


