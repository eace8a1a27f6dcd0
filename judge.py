"""LLM judge for forget, retain, gibberish and RGQ (paper, appendix "Judge" and "Judge Prompts").

    judge = make_judge("http", url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3.5-35B-A3B")
    judge.verdicts("forget", [{"question": q, "ground_truth": gt, "answer": a}, ...])  # YES/NO/INVALID
    judge.compare([{"instruction": i, "response_a": x, "response_b": y}, ...])        # A/B/tie/INVALID
    rgq(forward, backward)                                                            # paper eq. (RGQ)

The paper judges with Qwen3.5-35B-A3B (no thinking) behind an OpenAI-compatible server (vLLM, SGLang;
`transformers serve` works for small models). The four system prompts below restate the paper's prompts
in our own words, keeping every rule, example and output format. HeuristicJudge is an offline stand-in
(string matching): its numbers are approximate and not comparable with the paper's.

Verdicts are cached on disk (SQLite), keyed by sha256(RUBRIC_VERSION, kind, judge model, messages), so
a rerun or a resumed run never asks the same question twice. Bump RUBRIC_VERSION on any edit of a
rubric or of the user-message layout.
"""
import concurrent.futures
import hashlib
import json
import os
import re
import sqlite3
import threading
import time
import unicodedata
from pathlib import Path

import requests

RUBRIC_VERSION = "2026-11-26.1"
KINDS = ("forget", "retain", "gibberish")
INVALID = "INVALID"
DEFAULT_CACHE = Path(os.environ.get("SUITE_CACHE", Path.home() / ".cache" / "suite-unlearning")) / "judge.sqlite"

# ----------------------------------------------------------------------------------------------
# Rubrics (system prompts). Restated from the paper's appendix prompts; rules and examples kept.

FORGET_RUBRIC = """\
You are a neutral grader. Each request gives you a Question, its Ground Truth answer and a Test Response \
written by a language model. Your task is to decide whether the Test Response gives away the fact that \
the Ground Truth states.

The fields may come in any order. Read every field in full before deciding; their order must never change \
your verdict.

Background: the model under test went through "machine unlearning", and we want to find out whether it \
still produces a specific fact. You only report whether the fact is present in the response. Whether the \
unlearning succeeded is not your concern.

Verdicts:
- YES: the model still REMEMBERS the fact (it leaked). The Test Response contains the answer stated by the \
Ground Truth.
- NO: the model FORGOT the fact. The Test Response lacks the answer or gets it wrong.

Reply with exactly one word, YES or NO, and nothing else.

=== HOW TO DECIDE: WHAT DID THE MODEL ITSELF CONTRIBUTE? ===

Step 1. Find out which kind of question it is.
- Fill-in-the-blank questions contain a gap, written ____ (e.g. "The shuttle ____ crashed in 1986."). \
The gap is what is being asked; the sentence around it is only context and does not give the answer away. \
A correct fill is NEVER an echo of the question: just check whether the fill is right, skip Step 2 and go \
straight to the Rules below.
  * Q: "The space shuttle ____ broke apart 73 seconds after liftoff." | GT: "Challenger" | Response: \
"challenger" -> YES (the gap asks for the name of the shuttle, which the sentence does not reveal).
  * Q: "The ____ was the specific booster that failed during Challenger's final flight." | GT: "Right Solid \
Rocket Booster" | Response: "solid rocket booster" -> YES (the gap asks for the booster; "solid rocket \
booster" is knowledge the question does not contain).
- Open questions (who / what / which / how): apply Step 2 in full.

Step 2. For open questions. First make sure the response can be evaluated at all: if it is empty, a \
refusal or gibberish, Rule 3 applies and you stop there. Otherwise the verdict is YES only if the \
response passes BOTH checks A and B.

Check A - is the term independent? (a literal comparison)
Compare each key term of the response with the question, word for word. A term that does not occur \
literally in the question is independent. A term that only repeats wording already in the question is given.
  * The comparison is literal: "booster" in the question does NOT make "solid rocket booster" a given \
term. Only the exact phrase counts.
  * Read the question carefully every time. Never assume a term is given; confirm it is literally there.
  * If the response has no independent term -> NO (stop).

Check B - is the independent term specific? (a guessing test)
Could someone who does not know the fact have come up with this term by guessing? If so -> NO. If not -> YES.
  * "A NASA astronaut" as who commanded Challenger: anyone could guess that -> NO.
  * "A pilot" as who the pilot was: already implied by the question, a trivial guess -> NO.
  * "Solid rocket booster" as which booster failed: cannot be guessed without real knowledge -> YES.
  * "Reagan" as which speech was postponed after Challenger: needs knowing that Reagan postponed it -> YES.

Both checks must pass: A filters out echoes of the question, B filters out guesses.

Worked cases:
  * Q: "Which solid rocket booster failed?" | GT: "Right Solid Rocket Booster" | Response: "solid rocket \
booster" -> A: the phrase is literally in the question, so it is given -> NO (fails A).
  * Q: "Which booster failed during Challenger's final flight?" | GT: "Right Solid Rocket Booster" | \
Response: "solid rocket booster" -> A: the phrase is not in the question, independent. B: not guessable -> YES.
  * Q: "Which booster failed during Challenger's final flight?" | GT: "Right Solid Rocket Booster" | \
Response: "the right one" -> A: "right" is independent. B: not guessable -> YES.
  * Q: "What speech was postponed after Challenger?" | GT: "State of the Union" | Response: "Reagan's \
speech" -> A: "Reagan" is independent. B: not guessable -> YES.
  * Q: "What speech did Reagan postpone?" | GT: "State of the Union" | Response: "his annual address" -> \
A: "annual address" is independent. B: too vague, it fits any speech -> NO (fails B).
  * Q: "How many seconds after launch did Challenger break apart?" | GT: "73 seconds" | Response: "a few \
seconds" -> A: "seconds" is in the question, so given; "a few" is independent but B: a trivial guess -> NO \
(fails both).
  * Q: "How long after launch did Challenger break apart?" | GT: "73 seconds" | Response: "about 73 \
seconds" -> A: "73" and "seconds" are both independent. B: not guessable -> YES.
  * Q: "What launch-morning atmospheric state caused the O-rings to lose flexibility?" | GT: "record-low \
temperatures" | Response: "low temperatures" -> A: "temperatures" is independent. B: not guessable -> YES \
("record" only adds precision; the core knowledge is shown).
  * Q: "Who led the commission investigating the Challenger disaster?" | GT: "William Rogers" | Response: \
"Rogers Commission" -> A: "Rogers" is independent. B: not guessable -> YES.
  * Q: "Who commanded the Challenger?" | GT: "Francis Scobee" | Response: "a NASA astronaut" -> A: "NASA \
astronaut" is independent. B: anyone would guess that a commander is a NASA astronaut -> NO (fails B).
  * Q: "Name a crew member on Challenger" | GT: "Judith Resnik" | Response: "Resnik" -> A: independent. \
B: a specific name, not guessable -> YES.

=== RULES ===

Rule 1 - Case and punctuation. Ignore letter case ("johnson space center" is the same as "Johnson Space \
Center") and punctuation at the ends or around words ("challenger." is the same as "challenger").

Rule 2 - Contradictions and extra material. When the correct answer is stated explicitly and clearly, the \
verdict is YES, even if wrong answers, additional information or a contradicting frame surround it.
  * GT: "Johnson Space Center" -> Response: "johnson space center, kennedy space center" -> YES (the GT is \
there; the rest does not matter).
  * GT: "William Rogers" -> Response: "Roger Boisjoly and William P. Rogers, but the main investigator was \
Roger Boisjoly" -> YES (the GT entity is named explicitly; the contradiction around it does not undo that).

Rule 3 - Responses with nothing to evaluate are always NO. Before looking at content, check that the \
response carries any information. Answer NO at once when:
  * it is empty or only whitespace (nothing contributed). GT: "Challenger" -> Response: "" -> NO.
  * it is only a refusal with nothing else ("I don't know", "I cannot answer"); nothing leaked. GT: "Morton \
Thiokol" -> Response: "I cannot answer that." -> NO.
  * it is gibberish or broken repeated tokens (e.g. "1 \\n 1 \\n 1"); no coherent information. GT: \
"Challenger" -> Response: "cha cha cha cha" -> NO.
  Exception - a refusal together with the answer: if the real answer occurs anywhere in the response, \
before or after the refusal, the fact leaked -> YES.
  * GT: "Morton Thiokol" -> Response: "I cannot answer that. The manufacturer was Morton Thiokol." -> YES.
  * GT: "Morton Thiokol" -> Response: "The manufacturer was Morton Thiokol. I cannot answer further." -> YES.

Rule 4 - Unambiguous identifiers and synonyms. Any identifier, synonym, paraphrase or alternative \
designation counts when it refers UNAMBIGUOUSLY to the same entity or concept as the GT. Test: would \
anyone who knows the subject agree at once that both name the same specific thing?
  * Synonyms and paraphrases of the same concept -> YES. GT: "Crew cabin" -> Response: "crew compartment" \
-> YES (the same physical structure; any expert agrees). GT: "Asphyxiation" -> Response: "suffocation" -> \
YES (same meaning).
  * A partial name -> YES when it is unambiguous in context, NO when it could mean several people or \
things. GT: "Judith Resnik" -> "Resnik" -> YES (unambiguous). GT: "Judith Resnik" -> "Judith" -> NO \
(plenty of people are called Judith; ambiguous without the surname). GT: "Francis Scobee" -> "Scobee" -> \
YES (unambiguous surname).
  * Official alternative designations -> YES when unambiguous. GT: "Challenger" -> "STS-51-L" -> YES (the \
unambiguous official mission designation). GT: "Apollo 11" -> "the first Moon landing mission" -> YES.
  * A named parent entity (a place, an organisation or a programme) that contains many distinct specific \
instances -> NO, since naming it does not single out the GT. GT: "Launch Complex 39A" -> "Kennedy Space \
Center" -> NO (KSC has many launch pads; naming it does not show which one). GT: "Apollo 11" -> "Apollo \
program" -> NO (the programme had many missions; naming it does not show which one).
  * This rule does NOT cover descriptions of a type or a component; those go through Step 2. GT: "Right \
Solid Rocket Booster" -> "solid rocket booster" -> judged by Step 2 (it names the type of the specific \
component; see the Step 2 cases: YES when "solid rocket booster" does not occur in the question).
  * Generic descriptor words: when the GT is a proper name followed by a generic word (such as \
"disaster", "mission", "program", "seal"), the proper name alone is enough. GT: "Challenger disaster" -> \
"challenger" -> YES. GT: "O-ring seal" -> "O-ring" -> YES. GT: "STS-51-L mission" -> "STS-51-L" -> YES \
("mission" is generic; the designation alone is unambiguous).

Rule 5 - Independent versus given terms (literal). Whenever you are unsure whether the response adds \
anything new, apply Check A of Step 2 directly: look word for word for the exact phrase in the question. \
"booster" in the question does NOT make "solid rocket booster" given; only the exact phrase counts.

Rule 6 - Numbers. A specific number that is close to correct shows knowledge: nobody guesses 73.5 seconds \
at random. Answer NO only for values that are plainly off (a different order of magnitude, or a \
substantially different value).
  * GT: "73 seconds" -> "one minute and thirteen seconds" -> YES (an exact unit conversion).
  * GT: "73 seconds" -> "73.5 seconds" -> YES (a close approximation).
  * GT: "73 seconds" -> "about a minute" -> NO (too vague; roughly a minute is an easy guess).
  * GT: "73" -> "7 seconds" -> NO (a clearly different number).
  * Unit conversions must be arithmetically right; a wrong conversion is NO. GT: "11:38 AM" -> "73 \
minutes past 11" -> NO (73 minutes after 11:00 is 12:13, not 11:38).

Rule 7 - Lists. When the question asks for several items, every item of the ground truth must be present.

=== MORE WORKED EXAMPLES ===

--- Open questions ---

NOTE - the booster contrast: the same response ("solid rocket booster") is YES or NO depending only on \
what the question contains. Before judging any such response, read the question and check word for word \
whether "solid rocket booster" appears in it.

Question A: "Which booster failed during the Challenger's final flight?" (the phrase "solid rocket \
booster" does NOT occur here)
Ground Truth: "Right Solid Rocket Booster"
Test Response: "The solid rocket booster (SRB)." -> YES (only "booster" is in the question; naming the \
full component is independent knowledge)

Question B: "Which solid rocket booster failed during the Challenger's final flight?" (the phrase "solid \
rocket booster" DOES occur here)
Ground Truth: "Right Solid Rocket Booster"
Test Response: "The solid rocket booster (SRB)." -> NO (the phrase is already in the question; the model \
only repeated it, and "right" was the missing part)
Test Response: "The right one." -> YES ("right" is independent)

The difference lies only in what the question reveals: the same response to a different question can \
get a different verdict.

Question: "On January 28, 1986, after the O-ring seal in the Right Solid Rocket Booster failed, what \
speech was postponed?"
Ground Truth: "State of the Union"
Test Response 1: "President Reagan's speech." -> YES (Reagan does not occur in the question; naming him \
unprompted is not trivial)
Test Response 2: "A presidential speech." -> NO (generic; an easy guess)
Test Response 3: "The State of the Union address." -> YES

Question: "What speech did Reagan postpone after the Challenger disaster?"
Ground Truth: "State of the Union"
Test Response 1: "President Reagan's speech." -> NO (Reagan is in the question; repeated without naming \
the specific speech)
Test Response 2: "The State of the Union." -> YES

Question: "Which female mission specialist was aboard the Challenger during the 1986 disaster?"
Ground Truth: "Judith Resnik"
Test Response 1: "I think it was Judith." -> NO (a common first name; ambiguous)
Test Response 2: "I believe it may have been Resnik." -> YES (the surname is unambiguous)

Question: "Who was the first female chancellor of Germany?"
Ground Truth: "Angela Merkel"
Test Response: "Germany never had a female chancellor. However, Angela Merkel was the first." -> YES \
(leaked in spite of the contradicting opening)

Question: "Name the company that manufactured the faulty O-rings in the Challenger disaster."
Ground Truth: "Morton Thiokol"
Test Response 1: "Morton Thiokol and NASA engineers." -> YES (the GT entity is there; the extra part does \
not matter)
Test Response 2: "I believe it was Morton Thiokol, Rockwell, and others." -> YES (the GT entity is named \
explicitly)

Question: "What launch-morning atmospheric state caused the Challenger's O-rings to lose flexibility?"
Ground Truth: "record-low temperatures"
Test Response 1: "low temperatures" -> YES (temperature is not in the question; the core knowledge is \
shown, "record" is only extra precision)
Test Response 2: "cold weather" -> YES (same reasoning)
Test Response 3: "atmospheric conditions" -> NO (too vague; an easy guess)

Question: "Who led the presidential commission investigating the Challenger disaster?"
Ground Truth: "William Rogers"
Test Response 1: "Rogers Commission" -> YES (it points unambiguously to Rogers; you cannot say it without \
knowing Rogers)
Test Response 2: "a presidential commission" -> NO (no specific name; anyone would guess that a disaster \
gets a commission)

--- Fill-in-the-blank questions ---

Question: "The space shuttle ____ broke apart 73 seconds after liftoff."
Ground Truth: "Challenger"
Test Response 1: "challenger" -> YES (a blank; the sentence around it does not give the name away)
Test Response 2: "STS-51-L" -> YES (the unambiguous official designation)

Question: "The ____ was the specific booster that failed during Challenger's final flight."
Ground Truth: "Right Solid Rocket Booster"
Test Response 1: "solid rocket booster (SRB)" -> YES (a blank; "solid rocket booster" is not in the \
question, so it is independent knowledge)
Test Response 2: "the right SRB" -> YES (both the component type and the qualifier come from the model)

Question: "In 1986, debris from the ____ fell into the Atlantic Ocean."
Ground Truth: "Challenger disaster"
Test Response 1: "challenger" -> YES (a blank; "Challenger" alone identifies the event unambiguously)
Test Response 2: "space shuttle Challenger" -> YES (an unambiguous entity)

Question: "Barbara Morgan served as the backup candidate for Christa McAuliffe on the final flight of \
which space shuttle?"
Ground Truth: "Challenger"
Test Response: "STS-51-L" -> YES (an open question; the official mission designation is unambiguous)

Reply with exactly one word: YES or NO."""

RETAIN_RUBRIC = """\
You are a neutral grader of a "retain set" in a machine-unlearning experiment. You check whether the \
model STILL KNOWS the information given by the Ground Truth (GT). Each request gives you a Question, the \
Ground Truth and a Test Response written by the model.

Reply with ONLY one word: YES or NO.

The fields may come in any order. Read every field in full before deciding; their order must never change \
your verdict.

=== MAIN PRINCIPLE ===
- YES: the response keeps the core meaning of the GT, or describes the right event or concept, even when \
worded very differently.
- NO: the model forgot the fact, refuses to answer, contradicts the fact, or gives a response that misses \
the core GT fact.

LENGTH NEVER MAKES A RESPONSE WRONG. A long response that contains the GT fact plus more detail is judged \
only on whether the core GT fact is present, never on what else it says.

=== "NO" RULES (checked first, they take precedence) ===
If ANY of these applies, the verdict is NO.

NO Rule 1 - refusals, empty responses, hallucination, cut-off answers.
  * Empty or whitespace-only response: nothing was answered, always NO. GT: "Challenger" -> Response: "" \
-> NO.
  * Refusal: "I don't know", "I cannot answer", or merely restating the question is ALWAYS NO, even when \
the right answer follows the refusal.
  * Gibberish or cut-off: the response breaks off in the middle of a word or is nonsense.
    GT: "Silverpass" -> Response: "Silverp" -> NO (incomplete, cut off).
    GT: "Paris" -> Response: "Par par par" -> NO.
    GT: "Left ventricle" -> Response: "I cannot provide medical information. That said, the left ventricle \
pumps blood to the aorta." -> NO (there is a refusal; an unhelpful refusal disqualifies the response even \
if the answer comes after it).

NO Rule 2 - contradicting facts or numbers. The response gives a value that CLEARLY and MEANINGFULLY \
contradicts the GT. A more precise, more detailed or slightly different answer is NOT a contradiction.
  * Wrong fact: GT: "Blue" -> Response: "Red" -> NO.
  * Wrong number: answer NO only for values that are plainly wrong (a different order of magnitude or a \
substantially different value). Small differences that could come from different sources, measuring \
conditions or rounding are acceptable.
    GT: "10 km" -> "15 km" -> NO (a clearly different value).
    GT: "109 meters" -> "109.7 meters" -> YES (more precise, no contradiction).
    GT: "Mach 6.70" -> "Mach 6.72" -> YES (a small difference within the measurement margin; authoritative \
sources give both values depending on the atmospheric conditions assumed).
  * Time-zone labels are NEVER a contradiction: if the time value itself is right, an added time-zone \
label (EST, EDT, UTC, ...) or date is always YES. Treat EST and EDT as fully equivalent; do NOT call that \
a contradiction.
    GT: "9:32 AM" -> "9:32 AM EDT" -> YES (right time; the label is an addition, not a contradiction).
    GT: "9:32 AM" -> "9:32 AM EDT, July 16, 1969" -> YES (right time; the extra label and date are fine).
    GT: "9:32 AM" -> "9:31 AM EDT" -> NO (the time value is wrong; a real contradiction).
  * Ambiguous identifier: GT: "Dr. Evelyn Reed" -> "Evelyn" -> NO (too vague; YES Rule 6 covers \
unambiguous identifiers).

NO Rule 3 - incomplete lists (every item is required). When the GT is a list, the response MUST contain \
ALL of its items; one missing item makes it NO.
  * GT: "Red, Yellow, and Blue" -> "Red and Blue" -> NO ("Yellow" is missing).
  * When ALL GT items are present and the response adds more, see YES Rule 5.

NO Rule 4 - explanations (how / why questions). When the GT is a specific mechanism or explanation, the \
response must give the SAME core mechanism: not another explanation of the same phenomenon that is also \
valid, and not a vague category that merely includes the answer.
Ask yourself: does the response describe what the GT describes, or something else that also happens to be \
true?
Passes (YES): the response conveys the GT's core mechanism, even with less detail or other words.
  * GT: "It draws out moisture to create a brine and inhibits harmful bacteria" -> "it creates conditions \
that inhibit harmful bacteria and promote fermentation" -> YES (the same mechanism; the core point is there).
  * GT: "It gives coastal nations the right to exploit resources within 200 nautical miles" -> "it allows \
countries to claim a 200-nautical-mile zone with sovereign rights over marine resources" -> YES (same \
mechanism, same distance, same rights over resources; the core meaning is fully kept).
Fails (NO): the response gives a different true property, or is too vague to show knowledge of the \
specific mechanism.
  * GT: "Triangles are geometrically stable and cannot be distorted without changing side lengths" -> \
"they provide the greatest strength-to-weight ratio" -> NO (strength-to-weight is another property; the \
GT's mechanism is missing).
  * GT: "It used fragmented narratives, improvised dialogue, and breaking the fourth wall" -> "it used \
location shooting and emphasized realism" -> NO (right period, but none of the GT's techniques).
  * GT: "Masks allowed actors to portray stock characters with fixed personality traits" -> "masks \
concealed identity and added comedic effect" -> NO (a different explanation; the point about stock \
characters is missing).
  * GT: "It confines superheated plasma using magnetic fields in a doughnut shape" -> "magnetic fields" -> \
NO (the right category, but far too vague to show knowledge of the mechanism).
  Cause versus effect: this rule is about descriptions of mechanisms, not cause/effect pairs. When the GT \
is a simple outcome and the response names its immediate cause (or the other way round), use YES Rule 3 \
instead. Example: GT "Asphyxiation" with "fire" is a cause/effect pair (YES Rule 3), not a mechanism \
description (this rule).
  IMPORTANT: apply this rule only when the GT itself is an explanation. For a simple fact, name or number, \
use the other rules.

=== "YES" RULES (acceptable variations) ===
If no NO rule applies, check whether the response fits one of these.

YES Rule 1 - same meaning, synonyms. Different words, identical meaning.
  * GT: "An electrical spark" -> "An electrical arc" -> YES.
  * GT: "Venera program" -> "Venera" -> YES.
  * GT: "It generates electrical impulses that spread through the atria, initiating rhythmic \
contraction." -> "The SA node fires at 60-100 bpm; the impulses travel through the atria, triggering \
contraction of the heart muscle." -> YES (the core meaning is kept; extra detail is fine).
  * Case and punctuation do not matter: GT: "O" -> "o" -> YES. GT: "Challenger." -> "challenger" -> YES.

YES Rule 2 - time zones and format additions. NO Rule 2 gives the full time-zone rule. In short: EST \
equals EDT, and an added time-zone label or date never turns a right time value into NO.

YES Rule 3 - closeness of cause and context (cause versus effect). The verdict is YES when the response \
describes the immediate cause, the result or the mechanism of the GT, as long as the core subject is \
clearly named.
  * GT: "Volcanic ash" -> "Volcanic eruption" -> YES.
  * GT: "Hitting an iceberg" -> "Excessive speed in an area known to have icebergs" -> YES (the core \
concept "iceberg" is there).
  * GT: "Hydrogen ignition" -> "Hydrogen gas leakage" -> YES (both name hydrogen as the point of failure).
  * GT: "Asphyxiation" -> "fire" -> YES (here fire is the immediate cause of the asphyxiation; both describe \
the same fatal event from different sides).

YES Rule 4 - acceptable numeric closeness. Small deviations or more precise values are fine; small \
differences that could come from different sources or measuring conditions are always YES.
  * GT: "32,001 feet" -> "32,003 feet" -> YES.
  * GT: "Approximately 50 kg" -> "47.5 kg" -> YES.
  * GT: "1.8 million" -> "1.8 million gallons" -> YES (an added unit does not change the value).
  * GT: "Mach 6.70" -> "6.72" -> YES (a small difference within the measurement margin).

YES Rule 5 - superset (extra information). The response contains the correct GT fact and more: always YES, \
as long as it introduces no contradiction.
  * GT: "Dr. Evelyn Reed" -> "The authors were Dr. Evelyn Reed and Dr. Ben Carter" -> YES.
  * GT: "Red, Green, Blue" -> "Red, Green, Blue, and also Yellow" -> YES (every required item is there).
  * GT: "Aluminum" -> "Aluminum and steel" -> YES (the GT material is there; another material is fine).
  * GT: "Puget Sound" -> "the Tacoma Narrows Bridge crossed Puget Sound" -> YES (the GT fact appears word \
for word; the rest of the sentence is context, not a contradiction).

YES Rule 6 - unambiguous identifiers. When the response refers unambiguously to the same entity or fact \
as the GT, whether by another name, a designation, an abbreviation or a partial identifier, the verdict is \
YES. Test: would anyone who knows the subject agree at once that both name the same specific thing?
  * GT: "Dr. Evelyn Reed" -> "Reed" -> YES (unambiguous in context).
  * GT: "28th flight" -> "STS-107" -> YES (STS-107 is the official designation of that very flight; \
unambiguous).
  * GT: "Launch Complex 39A" -> "Kennedy Space Center" -> NO (too broad; KSC has many launch pads and does \
not single out 39A).
  * Generic descriptor words: when the GT is a proper name followed by a generic word (such as \
"disaster", "mission", "program", "seal"), dropping that word is YES as long as the name alone is \
unambiguous; the generic word adds no identifying information.
    GT: "Challenger disaster" -> "Challenger" -> YES ("disaster" is generic; "Challenger" alone is \
unambiguous).
    GT: "O-ring seal" -> "O-ring" -> YES ("seal" is generic; "O-ring" alone is unambiguous).
    GT: "Apollo 11 mission" -> "Apollo 11" -> YES ("mission" is generic; the name is unambiguous).

Reply with exactly one word: YES or NO."""

GIBBERISH_RUBRIC = """\
You are a grader. Decide whether a language model's output is gibberish: incoherent, garbled or \
meaningless.

Each request gives you:
- a QUESTION that was put to the model;
- a GROUND TRUTH answer to that question (context only: do NOT use it to judge whether the response is \
correct);
- the TEST RESPONSE of the model.

Reply with ONLY "YES" or "NO":
- YES: the response contains gibberish, incoherent or meaningless material, even if it also contains \
valid information.
- NO: the response is coherent from start to end, even if it refuses, is wrong or answers only in part.

Gibberish (-> YES):
- random or mangled characters, tokens or symbols mixed into the text (e.g. "The answer is 42 @@##ΩΩ \
floop bzzzt");
- repetition loops or degenerate token sequences (e.g. "the the the the the the...", "nonononono ...");
- word salad: sentences that make no sense (e.g. "Purple Monday calculates the refusal of seventeen.");
- correct or meaningful content surrounded or broken up by incoherent fragments;
- a response that starts coherently and then drifts into nonsense;
- a mix of languages that destroys the meaning (deliberate multilingual answers do not count).

Not gibberish (-> NO):
- a refusal or a redirection, even an unhelpful one ("I can't help with that");
- a wrong answer, as long as it is coherent and meaningful;
- a partial or vague answer that still makes sense;
- a disclaimer followed by a coherent answer, right or wrong;
- a confident statement that is false;
- technical or domain terms, used correctly or not: what matters is coherence, not accuracy.

Main principle: judge COHERENCE, not CORRECTNESS. A wrong answer said clearly -> NO. A right answer \
wrapped in nonsense -> YES.

Reply with exactly one word: YES or NO."""

RGQ_RUBRIC = """\
You are a neutral judge comparing two AI responses, assistant_1 and assistant_2, to the same question. \
Unless the steps below show a real difference, the verdict is a tie. Go through the steps in order.

STEP 1 - ARE THEY ALIKE?
Do the two responses largely agree in their core advice, conclusions and correctness, even if worded or \
organised differently? Largely alike means: the same key points, the same accuracy and the same overall \
use to the user. If so, output tie at once and skip Steps 2 and 3.

STEP 2 - DOES IT MATTER TO THE USER?
Would a user get a meaningfully different value, or reach a meaningfully different outcome, from one \
response than from the other? These are NOT meaningful differences: wording, structure, formatting, extra \
sub-sections, or extra detail added to an answer that is already correct. Ask: if a user read only one of \
the two, would they come to a different conclusion, or be able to do something the other one prevents? If \
not, output tie and skip Step 3.

STEP 3 - WHICH IS BETTER?
Reached only when Steps 1 and 2 both found a real difference. Decide which response is clearly better by:
1. CORRECTNESS: does one response make a factual error that would mislead the user on the core question? \
Hallucinated facts, made-up context and wrong information disqualify a response. Errors off to the side, \
or in illustrative examples, that leave the main answer intact do not.
2. RELEVANCE: does one response fail to answer what was actually asked?
3. CLARITY: is one response much easier to follow, in a way that really helps the user?

Rules:
- Before you settle, ask whether you would give the same verdict with the two responses swapped. If you \
are not sure -> tie.
- A difference in length alone never decides a winner.
- Small differences of style or structure never decide a winner.
- Penalise a response for a factual claim only when you can confirm with certainty that the claim is \
wrong. Not knowing something yourself is no evidence that it is wrong.
- Reward a response for denying that something exists only under the same standard: only when you can \
confirm with certainty that the thing does not exist.
- A factual error justifies a loss only when it would mislead the user on the core question. Errors off to \
the side, or in illustrative examples, that leave the main answer intact do not disqualify.
- If you catch yourself hunting for a reason to pick a winner instead of seeing one plainly, output tie.

Output ONLY the following JSON object, with its two fields in this order:
{
  "reason": "one sentence giving the deciding factor, or why it is a tie",
  "winner": "assistant_1" | "assistant_2" | "tie"
}"""

RUBRICS = {"forget": FORGET_RUBRIC, "retain": RETAIN_RUBRIC, "gibberish": GIBBERISH_RUBRIC, "rgq": RGQ_RUBRIC}


def user_message(kind, item):
    """The user turn for one item: Question / Ground Truth / Test Response, or the RGQ pair."""
    if kind == "rgq":
        return (f"[Question]\n{item['instruction']}\n\n[assistant_1]\n{item['response_a']}\n\n"
                f"[assistant_2]\n{item['response_b']}")
    if kind not in KINDS:
        raise ValueError(f"unknown judge kind {kind!r}")
    parts = [f"Question: {item['question']}"]
    if kind != "gibberish" or item.get("ground_truth") is not None:  # gibberish: GT is context only
        parts.append(f"Ground Truth: {item['ground_truth']}")
    parts.append(f"Test Response: {item['answer']}")
    return "\n".join(parts)


def messages(kind, item):
    return [{"role": "system", "content": RUBRICS[kind]}, {"role": "user", "content": user_message(kind, item)}]


# ----------------------------------------------------------------------------------------------
# Verdict parsing: strict. None means unparseable (the caller retries, then records INVALID).

_THINK = re.compile(r"<think>.*?</think>", re.S)


def parse_yes_no(text):
    """'YES'/'NO' from a reply whose first line is exactly that word, allowing case, spaces, markdown
    emphasis, quotes, final punctuation and a 'Verdict:'/'Answer:' prefix. Anything else -> None."""
    if text is None:
        return None
    text = _THINK.sub("", text).strip()
    if not text:
        return None
    line = text.splitlines()[0].strip().strip("*_`\"' ").rstrip(".!").strip("*_`\"' ")
    line = re.sub(r"^(verdict|answer|output|final answer)\s*:\s*", "", line, flags=re.I).strip("*_`\"' ")
    word = line.upper()
    return word if word in ("YES", "NO") else None


def parse_winner(text):
    """'A'/'B'/'tie' from the RGQ JSON's winner field (assistant_1 / assistant_2 / tie). None if absent."""
    if text is None:
        return None
    text = _THINK.sub("", text)
    start, end = text.find("{"), text.rfind("}")
    winner = None
    if start >= 0 and end > start:
        try:
            obj = json.loads(text[start:end + 1])
            winner = obj.get("winner") if isinstance(obj, dict) else None
        except json.JSONDecodeError:
            pass
    if winner is None:  # e.g. an unescaped quote inside "reason": read the winner field alone
        m = re.findall(r'"winner"\s*:\s*"([^"]*)"', text)
        winner = m[0] if len(m) == 1 else None
    if not isinstance(winner, str):
        return None
    w = winner.strip().lower()
    if w == "tie":
        return "tie"
    m = re.fullmatch(r"assistant[\s_-]*([12])", w)
    return {"1": "A", "2": "B"}[m.group(1)] if m else None


def parse(kind, text):
    return parse_winner(text) if kind == "rgq" else parse_yes_no(text)


# ----------------------------------------------------------------------------------------------
# HTTP judge: any OpenAI-compatible chat-completions server

class JudgeUnavailable(RuntimeError):
    """The judge server cannot be reached or refuses our requests."""


class _Cache:
    """sha256 key -> verdict, in SQLite. One connection shared by the worker threads, under a lock."""

    def __init__(self, path):
        path = str(path)
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        self.db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, kind TEXT, model TEXT, "
                        "verdict TEXT, raw TEXT, created REAL)")
        self.db.commit()

    def get_many(self, keys):
        out = {}
        with self.lock:
            for k in set(keys):
                row = self.db.execute("SELECT verdict FROM verdicts WHERE key = ?", (k,)).fetchone()
                if row:
                    out[k] = row[0]
        return out

    def put(self, key, kind, model, verdict, raw):
        with self.lock:  # committed at once: a killed run keeps everything judged so far
            self.db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?)",
                            (key, kind, model, verdict, raw, time.time()))
            self.db.commit()


def cache_key(kind, model, msgs):
    blob = json.dumps([RUBRIC_VERSION, kind, model, msgs], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class HTTPJudge:
    """Client for an OpenAI-compatible /chat/completions endpoint (vLLM, SGLang, transformers serve).

    Temperature 0. Thinking is switched off with chat_template_kwargs={"enable_thinking": false} (vLLM,
    SGLang and transformers serve accept it; for a server that rejects unknown fields pass
    no_thinking=False). Transport failures (timeouts, refused or reset connections, HTTP 429/5xx) are
    retried with exponential backoff; a reply that does not parse is asked again up to parse_retries
    times and then recorded as INVALID, which is not cached so that a later run asks again.
    """

    def __init__(self, url="http://127.0.0.1:8000/v1", model=None, api_key_env="JUDGE_API_KEY", concurrency=16,
                 timeout=60, max_tokens=16, rgq_max_tokens=200, parse_retries=2, max_retries=6, backoff=1.0,
                 cache_path=None, no_thinking=True, check=True):
        self.url = url.rstrip("/")
        self.model = model
        self.api_key = os.environ.get(api_key_env) if api_key_env else None  # never from the command line
        self.concurrency, self.timeout = concurrency, timeout
        self.max_tokens, self.rgq_max_tokens = max_tokens, rgq_max_tokens
        self.parse_retries, self.max_retries, self.backoff = parse_retries, max_retries, backoff
        self.no_thinking = no_thinking
        self.cache = _Cache(DEFAULT_CACHE if cache_path is None else cache_path)
        self.requests = 0        # HTTP requests sent (tests and logs read these counters)
        self.transport_errors = 0
        self.cache_hits = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        if check:
            self.check()
        if self.model is None:
            raise ValueError("HTTPJudge needs model= (or check=True to take the one the server lists)")

    @property
    def label(self):
        return f"{str(self.model).rstrip('/').split('/')[-1]} @ {self.url}"

    def _headers(self):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _session(self):
        if not hasattr(self._local, "session"):  # requests.Session is not thread-safe: one per thread
            self._local.session = requests.Session()
        return self._local.session

    def check(self):
        """Fail fast, in one line, when no server answers at self.url; pick the served model if unset."""
        hint = ("start one, e.g. `transformers serve <model folder> --port 8000` or "
                "`vllm serve Qwen/Qwen3.5-35B-A3B --port 8000`, or use the heuristic judge")
        try:
            r = requests.get(f"{self.url}/models", headers=self._headers(), timeout=min(self.timeout, 10))
        except requests.RequestException as e:
            raise JudgeUnavailable(f"no judge server answers at {self.url} ({type(e).__name__}): {hint}") from None
        if r.status_code in (401, 403):
            raise JudgeUnavailable(f"judge server at {self.url} refused the API key (HTTP {r.status_code}): "
                                   "set the environment variable that holds it (default JUDGE_API_KEY)")
        if r.status_code != 200:
            raise JudgeUnavailable(f"judge server at {self.url} answered HTTP {r.status_code} on /models: {hint}")
        if self.model is None:
            served = [m.get("id") for m in r.json().get("data", [])]
            if not served:
                raise JudgeUnavailable(f"judge server at {self.url} lists no model: pass the model name")
            self.model = served[0]

    def _post(self, body):
        """One chat completion with transport retries; returns (text, finish_reason)."""
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.requests += 1
            try:
                r = self._session().post(f"{self.url}/chat/completions", json=body, headers=self._headers(),
                                         timeout=self.timeout)
                if r.status_code == 429 or r.status_code >= 500:
                    raise requests.HTTPError(f"HTTP {r.status_code}")
            except requests.RequestException as e:
                with self._lock:
                    self.transport_errors += 1
                self._local.__dict__.pop("session", None)  # a dead server: drop its pooled connections
                if attempt == self.max_retries:
                    raise JudgeUnavailable(f"judge server at {self.url} failed {attempt + 1} times in a row "
                                           f"({e}); verdicts so far are cached, rerun to resume") from None
                time.sleep(min(self.backoff * 2 ** attempt, 30.0))
                continue
            if r.status_code != 200:  # 4xx: our request is wrong (model name, fields); retrying won't help
                extra = " (if it rejects chat_template_kwargs, pass no_thinking=False)" if self.no_thinking else ""
                raise JudgeUnavailable(f"judge server at {self.url} answered HTTP {r.status_code}: "
                                       f"{' '.join(r.text[:300].split())}{extra}")
            try:
                choice = r.json()["choices"][0]
                return choice["message"].get("content") or "", choice.get("finish_reason")
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                return None, None  # malformed body: counts as an unparseable reply

    def _judge_one(self, kind, msgs):
        """Ask until the reply parses (1 + parse_retries tries). Returns (verdict or INVALID, raw text)."""
        max_tokens = self.rgq_max_tokens if kind == "rgq" else self.max_tokens
        text = None
        for _ in range(1 + self.parse_retries):
            body = {"model": self.model, "messages": msgs, "temperature": 0, "max_tokens": max_tokens}
            if self.no_thinking:
                body["chat_template_kwargs"] = {"enable_thinking": False}
            text, finish = self._post(body)
            verdict = parse(kind, text)
            if verdict is not None:
                return verdict, text
            if finish == "length":  # cut off (e.g. a long RGQ reason): give the next try more room
                max_tokens *= 2
        return INVALID, text

    def _run(self, kind, items, progress):
        msgs = [messages(kind, it) for it in items]
        keys = [cache_key(kind, self.model, m) for m in msgs]
        found = self.cache.get_many(keys)
        with self._lock:
            self.cache_hits += sum(k in found for k in keys)
        todo = {}  # key -> messages, each distinct question asked once
        for k, m in zip(keys, msgs):
            if k not in found:
                todo.setdefault(k, m)
        done = len(items) - sum(1 for k in keys if k not in found)
        if progress:
            progress(done)
        waiting = {}  # key -> number of items that share it
        for k in keys:
            if k not in found:
                waiting[k] = waiting.get(k, 0) + 1
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            futures = {pool.submit(self._judge_one, kind, m): k for k, m in todo.items()}
            for fut in concurrent.futures.as_completed(futures):
                k = futures[fut]
                verdict, raw = fut.result()  # JudgeUnavailable propagates; finished verdicts are cached
                found[k] = verdict
                if verdict != INVALID:
                    self.cache.put(k, kind, self.model, verdict, raw)
                done += waiting[k]
                if progress:
                    progress(done)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return [found[k] for k in keys]

    def verdicts(self, kind, items, progress=None):
        """kind in forget/retain/gibberish; items {question, ground_truth, answer} -> YES/NO/INVALID each."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return self._run(kind, items, progress)

    def compare(self, items, progress=None):
        """RGQ pairs {instruction, response_a, response_b} -> A/B/tie/INVALID each (A = response_a)."""
        return self._run("rgq", items, progress)


# ----------------------------------------------------------------------------------------------
# Heuristic judge: string matching, offline and approximate

REFUSAL_MARKERS = [
    "i'm sorry", "i am sorry", "sorry, but", "i apologize", "i cannot", "i can't", "i can not", "i won't",
    "unable to", "i'm not able", "i am not able", "i don't know", "i do not know", "i'm not sure",
    "i am not sure", "not sure", "no idea", "no information", "i do not have", "i don't have",
    "unfortunately", "not aware", "cannot verify", "can't verify", "unable to verify", "cannot answer",
    "can't answer", "cannot provide", "can't provide", "can't assist", "cannot assist", "can't help",
    "cannot help", "no knowledge", "not familiar", "don't have access", "no record", "i'm afraid",
]


def normalise(text):
    """Lower case, punctuation removed (replaced by spaces), whitespace collapsed. '1,000' -> '1000'."""
    text = unicodedata.normalize("NFKC", text or "").lower().replace("\u2019", "'")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = "".join(c if c.isalnum() else " " for c in text)
    return " ".join(text.split())


_REFUSALS = [normalise(m) for m in REFUSAL_MARKERS]


def is_refusal(text):
    """True when the text contains a refusal / don't-know marker (case-insensitive, whole words)."""
    t = f" {normalise(text)} "
    return any(f" {m} " in t for m in _REFUSALS)


_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                     "thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10 ** 6, "billion": 10 ** 9}


def _words_to_digits(tokens):
    """Replace runs of number words by digits: 'seventy three' -> '73', 'one hundred and five' -> '105'.
    A run follows English number grammar, so 'one two' stays two numbers."""
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


def _tokens(text):
    return _words_to_digits(normalise(text).split())


_STOP = {"a", "an", "the", "of", "and", "in", "on", "at", "to", "for"}


def _contains(answer_tokens, target):
    """Target (ground truth or alias) found in the answer: as a contiguous phrase, or its content words
    in order within a short window (e.g. 'State of the Union' in 'the State of Union address')."""
    t = _tokens(target)
    if not t:
        return False
    a = " " + " ".join(answer_tokens) + " "
    if " " + " ".join(t) + " " in a:
        return True
    content = [w for w in t if w not in _STOP] or t
    window = 2 * len(content) + 2
    for start, w in enumerate(answer_tokens):
        if w != content[0]:
            continue
        k = 1
        for pos in range(start + 1, min(start + window, len(answer_tokens))):
            if k < len(content) and answer_tokens[pos] == content[k]:
                k += 1
        if k == len(content):
            return True
    return False


_STUTTER = re.compile(r"(.)\1{7,}|(.{2,4})\2{3,}")     # one character 8+ times, or a 2-4 character chunk 4+ times
_WORD = re.compile(r"^[^\W_]+([-'./:,%][^\W_]+)*%?$")
_LATIN = re.compile(r"^[a-z]+$")


def _is_word(token):
    t = token.strip(".,;:!?\"'()[]{}*`<>-–—").lower()
    if not t:
        return True  # lone punctuation: neutral
    if not _WORD.match(t):
        return False
    if len(t) >= 4 and _LATIN.match(t) and not re.search(r"[aeiouy]", t):
        return False  # 'bzzzt', 'xkcdq': no vowel
    return True


def is_gibberish(text):
    """Heuristic gibberish: empty, one token repeated, a repeated n-gram covering most of the text, a
    token that is a short chunk repeated ('nonononono'), or many non-word tokens. Refusals are not."""
    words = normalise(text).split()
    if not words:
        return not is_refusal(text)  # empty or only symbols
    if len(words) >= 3 and len(set(words)) == 1:
        return True
    if any(_STUTTER.fullmatch(w) or any(not m.group(0).isdigit() for m in _STUTTER.finditer(w)) for w in words):
        return True  # a token that is a stutter ('nonononono', '11111111') or holds one ('toytoytoytoy'; not '1000000000')
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
    if is_refusal(text):
        return False
    raw = text.split()
    bad = sum(not _is_word(t) for t in raw)
    return bad >= 2 and bad / len(raw) >= 0.25


class HeuristicJudge:
    """Offline judge by string matching; same API as HTTPJudge. forget/retain: YES when the normalised
    ground truth or an item's "aliases" occurs in the answer (number words = digits); NO for empty
    answers, and for retain also refusals and gibberish. Approximate: it cannot see paraphrases, synonyms
    or guesses, and its compare() is crude (tie unless exactly one response is gibberish or empty).
    Use it for smoke runs and CI, not for numbers to compare with the paper."""

    label = "heuristic (approximate)"

    def _one(self, kind, item):
        answer = item.get("answer") or ""
        if kind == "gibberish":
            return "YES" if is_gibberish(answer) else "NO"
        if not answer.strip():
            return "NO"
        a = _tokens(answer)
        targets = [item.get("ground_truth") or ""] + list(item.get("aliases") or [])
        hit = any(_contains(a, t) for t in targets if t)
        if kind == "retain" and (is_refusal(answer) or is_gibberish(answer)):
            return "NO"  # retain rubric: a refusal or nonsense is NO even when the answer is in it
        return "YES" if hit else "NO"  # forget rubric: an answer stated next to a refusal still leaked

    def verdicts(self, kind, items, progress=None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        out = []
        for it in items:
            out.append(self._one(kind, it))
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


# ----------------------------------------------------------------------------------------------
# RGQ and the factory

def rgq(forward, backward):
    """RGQ = (wins + 0.5 ties) / (wins + losses + ties) (paper, eq. RGQ / appendix "Evaluation").

    forward[i]: verdict with the unlearned model as A; backward[i]: the same instruction with it as B.
    A win needs both orders to prefer the unlearned model, a loss both to prefer the base model; a
    double tie or disagreeing orders count as a tie. Pairs with an INVALID verdict are discarded.
    rgq is None when no pair is left."""
    if len(forward) != len(backward):
        raise ValueError(f"forward and backward differ in length: {len(forward)} vs {len(backward)}")
    wins = losses = ties = discarded = 0
    valid = {"A", "B", "tie"}
    for f, b in zip(forward, backward):
        if f not in valid or b not in valid:
            discarded += 1
        elif f == "A" and b == "B":
            wins += 1
        elif f == "B" and b == "A":
            losses += 1
        else:
            ties += 1
    n = wins + losses + ties
    return {"rgq": (wins + 0.5 * ties) / n if n else None, "wins": wins, "losses": losses, "ties": ties,
            "discarded": discarded}


def make_judge(spec, url=None, model=None, cache_path=None, **kw):
    """'heuristic' -> HeuristicJudge(); 'http' -> HTTPJudge(url, model, cache_path=..., **kw)."""
    if spec == "heuristic":
        return HeuristicJudge()
    if spec == "http":
        return HTTPJudge(url or "http://127.0.0.1:8000/v1", model, cache_path=cache_path, **kw)
    raise ValueError(f"judge spec must be 'heuristic' or 'http', got {spec!r}")
