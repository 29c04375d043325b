"""How each kind of calc problem is worded: several phrasing families per kind, some held out.

A *phrasing family* is one template. A training template may hold choices, ``[has|owns|keeps]``: each
question made from it takes one alternative per choice, so one family stands for many wordings (the
verbs, question forms and orders of facts people use), and a model trained on them learns the
arithmetic rather than a sentence. Each kind's first template, with every first alternative, is the
wording the tutorial always used (``phrasings: original`` trains on that sentence alone); ``phrasings:
all`` takes every training template of the kind in turn, with its choices drawn at random.

``HELD_OUT`` templates are never used for training or for the question-held-out splits: they make the
``family`` split, which asks whether an agent learned the arithmetic or the sentence.
``tests/agents/test_calc_tasks.py`` checks that no wording a training template of any level stands
for repeats a held-out one, or seven words of one. The training wordings of levels 1-3 were written
after the held-out ones, by people who had read them: the family split is unseen *templates*, not a blind
test of vocabulary. Levels 4 and 5 (three and four operations) are never trained by the default levels;
they make the ``depth`` split, and their held-out templates the family split of a run that trains them.
Each level-4 kind's templates after its first two were written without reading any held-out template or
split output (issue 59: RL that met a new skill in two wordings only learned a habit where wordings were
new); only that overlap test compared them with the held-out ones.

Slots: ``name``/``other`` (two different people), ``item`` (plural), ``box`` (plural container),
numbers ``a`` ... ``e`` and ``ab`` (``a * b``, for divisions).
"""

from __future__ import annotations

import itertools
import random
import re

_CHOICE = re.compile(r"\[([^\[\]]*)\]")


def _parts(template: str) -> list[list[str]]:
    """A template as a list of alternatives per piece: fixed text is a piece with one alternative."""
    pieces = _CHOICE.split(template)
    return [piece.split("|") if i % 2 else [piece] for i, piece in enumerate(pieces)]


def variants(template: str) -> list[str]:
    """Every wording ``template`` stands for (one per combination of its choices)."""
    return ["".join(combo) for combo in itertools.product(*_parts(template))]


def first_variant(template: str) -> str:
    """The wording with every first alternative (the ``original`` one for a kind's first template)."""
    return "".join(options[0] for options in _parts(template))


def choose_variant(template: str, rng: random.Random) -> str:
    """One wording of ``template``, each choice drawn from ``rng`` (no draw for a template without choices)."""
    return "".join(rng.choice(options) if len(options) > 1 else options[0] for options in _parts(template))


_HOW_MANY_NOW = ("[How many {item} does {name} have now?|How many {item} does {name} have in total?|How many {item} "
                 "does {name} have altogether?]")
_HOW_MANY_LEFT = ("[How many {item} are left?|How many {item} remain?|How many {item} does {name} have left?|How "
                  "many {item} does {name} have now?]")

TRAIN: dict[str, tuple[str, ...]] = {
    # Level 1: a bare operation.
    "l1_add": (
        "[What is|What's|How much is] {a} [+|plus] {b}?",
        "[Compute|Calculate|Work out|Evaluate|Please compute|Please work out] {a} [plus|+] {b}.",
        "What do you get [when you add|if you add] {a} [and|to] {b}?",
        "[Add|Add up|Please add] {a} and {b}.",
        "{a} [plus|+] {b} [equals what?|is what?|makes what?|gives what number?|is how much?]",
        "What is the [sum|total] of {a} and {b}?",
        "[Give me|Tell me|I need] the [sum|total] of {a} and {b}.",
        "If you add {b} to {a}, what [do you get|is the result|is the answer]?",
        "What number is {b} more than {a}?",
        "Increase {a} by {b}. What [is the result|do you get]?",
    ),
    "l1_sub": (
        "[What is|What's|How much is] {a} [-|minus] {b}?",
        "[Compute|Calculate|Work out|Evaluate|Please compute|Please work out] {a} [minus|-] {b}.",
        "Subtract {b} from {a}[.| and give the result.]",
        "What is {a} [take away|less] {b}?",
        "What [remains|is left] when {b} is [taken from|subtracted from|removed from] {a}?",
        "{a} [minus|-] {b} [gives what number?|equals what?|is what?|is how much?]",
        "Take {b} away from {a}. What [is left|remains|do you get]?",
        "What is the difference [between|of] {a} and {b}?",
        "If you [subtract|take away|remove] {b} from {a}, what [do you get|is left]?",
        "Decrease {a} by {b}. What [is the result|do you get]?",
    ),
    "l1_mul": (
        "[What is|What's|How much is] {a} [*|times] {b}?",
        "[Compute|Calculate|Work out|Evaluate|Please compute|Please calculate] {a} [times|*] {b}.",
        "Multiply {a} [by|and] {b}.",
        "What is the product of {a} and {b}?",
        "[Give me|Tell me|I need] the product of {a} and {b}.",
        "{a} [times|*] {b} [equals what?|is what?|gives what number?|makes how many?]",
        "If you multiply {a} by {b}, what [do you get|is the result]?",
        "What is {a} [groups|lots|sets] of {b}?",
        "What do you get when you multiply {a} [by|and] {b}?",
        "What is {a} multiplied by {b}?",
    ),
    # Level 2: one-step word problems.
    "l2_add": (
        "{name} [has|owns|keeps] {a} {item} and [gets|receives|finds|buys|wins|is given|picks up|earns] "
        "[{b} more|another {b}]. " + _HOW_MANY_NOW,
        "{name} had {a} {item}. {other} [gave|handed|sent|brought] {name} {b} more. [How many {item} does {name} "
        "have?|How many {item} does {name} have now?|What is the total number of {item} now?]",
        "{name} [collected|picked|found|made|bought] {a} {item} on [Monday|Saturday|the first day] and {b} {item} on "
        "[Tuesday|Sunday|the second day]. [How many {item} did {name} get in total?|How many {item} is that "
        "altogether?|What is the total number of {item}?]",
        "{name} saved {a} {item} [last week|yesterday|in May] and {b} {item} [this week|today|in June]. [How many "
        "{item} has {name} saved?|How many {item} is that in all?]",
        "There are {a} {item} in one [pile|box|bag|room|drawer] and {b} in another. How many {item} are there "
        "[in all|altogether|in total]?",
        "{name} picks up {b} more {item}, adding to the {a} {item} {name} already had. How many {item} are there "
        "now?",
        "{name} [gets|buys|finds|is given] {b} new {item}. Before that, {name} had {a}. " + _HOW_MANY_NOW,
        "A [class|team|club|library] has {a} {item}. Another {b} [arrive|are added|are donated]. How many {item} "
        "does it have [now|in total]?",
        "[You have|You own|You start with] {a} {item}. [You get|You buy|You find|You are given] {b} more. How "
        "many {item} do you have [now|in total]?",
        "How many {item} does {name} have after [getting|buying|finding] {b} more? {name} had {a} {item} "
        "[before|at first].",
        "{other} [gives|hands|passes|brings] {name} [another {b}|{b} more] {item}. {name} had {a} {item} before. "
        + _HOW_MANY_NOW,
    ),
    "l2_sub": (
        "{name} has {a} {item} and [gives away|loses|sells|eats|uses|drops|donates|throws away] {b}. "
        "[How many {item} are left?|How many {item} remain?|How many {item} does {name} have left?|How many "
        "{item} does {name} have now?]",
        "{name} had {a} {item} and [lost|sold|used|gave away|ate|broke] {b} of them. [How many {item} does {name} "
        "have left?|How many {item} are left?|How many {item} does {name} still have?]",
        "A [shop|store|market|stall] had {a} {item} and sold {b}. How many {item} [remain|are left|does it "
        "have now]?",
        "{name} had {a} {item}. {other} [took|borrowed|ate|used] {b}. [How many {item} remain with {name}?|How "
        "many {item} does {name} have now?|How many {item} are left?]",
        "A [box|bag|jar|basket] holds {a} {item}. If {b} are [taken away|taken out|removed], how many {item} "
        "[stay in it|are still inside|are left]?",
        "{name} needs to [pack|sort|wash|count] {a} {item} and has done {b} so far. How many {item} [still need "
        "doing|are still to do|are left to do]?",
        "There were {a} {item}[ in the room| on the table| at the party]. {b} [were eaten|were taken|were "
        "sold|were lost|went missing]. How many {item} are [left|there now]?",
        "If {name} [has|starts with] {a} {item} and [gives away|loses|sells] {b}, how many [are left|does "
        "{name} have then]?",
        "{name} [loses|sells|gives away|uses] {b} {item}. [Before that|At first], {name} had {a}. " + _HOW_MANY_LEFT,
        "[You have|You own|You start with] {a} {item}. [You give away|You lose|You sell|You use] {b}. How many "
        "{item} do you have [left|now]?",
        "How many {item} does {name} have [left|now] after [giving|handing] {b} of {name}'s {a} {item} to {other}?",
    ),
    "l2_mul": (
        "There are {a} {box} with {b} {item} [in each|each|in every one]. [How many {item} are there?|How many "
        "{item} are there in total?|What is the total number of {item}?]",
        "{name} has {a} {box}, and each [holds|has|contains] {b} {item}. How many {item} does {name} have?",
        "Each of {a} {box} [contains|holds|has] {b} {item}. [What is the total number of {item}?|How many {item} "
        "are there altogether?]",
        "{name} [buys|gets|orders] {a} {box} of {item}. Each one has {b} {item}. How many {item} [did {name} "
        "get|is that in total]?",
        "A [store|shop|farm] puts {b} {item} in each of its {a} {box}. How many {item} is that in total?",
        "{name} lays out {a} rows of {item}, {b} in a row. How many {item} are laid out?",
        "{a} {box} hold {b} {item} [each|apiece]. How many {item} are there [in all|in total]?",
        "How many {item} are in {a} {box} with {b} in each?",
        "{a} [friends|kids|children|students] each [have|bring|get] {b} {item}. How many {item} do they have "
        "[together|in total|altogether]?",
        "{name} [reads|eats|collects|makes] {b} {item} [a day|every day|each day] for {a} days. How many {item} "
        "is that?",
        "How many {item} [are there|does {name} have] [if|when] {name} has {a} {box} with {b} {item} in each?",
    ),
    "l2_div": (
        "{name} [shares|splits|divides] {ab} {item} [equally|evenly] among {a} friends. How many {item} does each "
        "friend get?",
        "{ab} {item} are [split|divided|shared] evenly into {a} {box}. How many {item} go in each?",
        "If {a} [friends|people|kids|students] share {ab} {item} equally, how many {item} does each one get?",
        "{ab} {item} are shared out equally by {a} people. How many {item} does each person get?",
        "{name} puts {ab} {item} into {a} equal groups. How many {item} are in each group?",
        "Divide {ab} {item} evenly among {a} {box}. How many {item} go into each of them?",
        "{name} wants to split {ab} {item} into {a} equal [piles|groups|stacks]. How many {item} [go in|are in] "
        "each [one|of them]?",
        "There are {ab} {item} for {a} [children|players|guests]. If everyone gets the same number, how many "
        "{item} does each of them get?",
        "If {ab} {item} are [shared|split] evenly between {a} [people|kids], how many does each get?",
        "{name} [earns|saves|reads] {ab} {item} in {a} days, the same number each day. How many {item} is that "
        "[per day|a day|each day]?",
        "{a} [friends|kids|players] [split|share|divide] {ab} {item} [evenly|equally|fairly]. How many {item} does "
        "each [one|of them] get?",
        "{ab} {item} must go into {a} {box}, with an equal number in each. How many {item} go in each?",
        "Each of {a} [kids|children|people] gets an equal share of {ab} {item}. How many {item} is [one|each] share?",
        "{ab} {item} are [given out|passed out] [equally|evenly] to {a} [kids|people|students]. How many {item} "
        "does each [one|person] get?",
        "What does each of {a} [people|friends] get if {ab} {item} are [shared|split] [equally|evenly]?",
        "{name} has {a} [friends|guests] and {ab} {item} to give them. Everyone gets the same amount. How many "
        "{item} does each of them get?",
        "How many {item} does each one get if {ab} {item} are [shared|split] [equally|evenly] among {a} "
        "[children|people|friends]?",
    ),
    # Level 3: two operations.
    "l3_add_mul": (
        "{name} has {a} {item} and [buys|gets|receives|finds|wins|is given] {b} {box} with {c} {item} [in "
        "each|each]. " + _HOW_MANY_NOW,
        "{name} already has {a} {item}. Then {name} [buys|gets|receives] {b} {box} that [hold|contain|have] {c} "
        "{item} each. How many {item} does {name} have in total?",
        "[A teacher|A librarian|{name}] has {a} {item} on the desk and {b} {box} of {c} {item} each in the "
        "cupboard. How many {item} are there altogether?",
        "{name} had {a} {item}. Today {name} got {b} more {box}, each with {c} {item}. How many {item} does "
        "{name} have altogether?",
        "In a room there are {a} loose {item} and {b} {box} with {c} {item} in every box. How many {item} are in "
        "the room?",
        "{name} has {a} {item} and wins {b} {box} containing {c} {item} each. How many {item} does {name} have "
        "now?",
        "{name} [gets|buys|is given] {b} {box} of {c} {item} [each|apiece]. {name} [also has|already had] {a} "
        "{item}. [How many {item} does {name} have now?|How many {item} is that in total?]",
        "How many {item} does {name} have after [buying|getting] {b} {box} of {c} {item} each, if {name} "
        "[started with|already had] {a}?",
        "There are {a} {item} [on a shelf|in a bag] and {b} {box} [next to it|nearby] with {c} {item} in each. "
        "How many {item} are there in all?",
    ),
    "l3_mul_sub": (
        "{name} has {b} {box} with {c} {item} in each and [gives away|loses|sells|eats|uses] {a} {item}. "
        + _HOW_MANY_LEFT,
        "There are {b} {box} with {c} {item} each. {a} {item} are [taken out|removed|sold|eaten]. How many "
        "{item} remain?",
        "{name} buys {b} {box} of {c} {item} and then uses {a} of them. How many {item} are left?",
        "{name} bought {b} {box} with {c} {item} in each, then lost {a} {item}. How many {item} does {name} have "
        "now?",
        "A shop gets {b} {box} of {c} {item} and sells {a} {item}. How many {item} does the shop have left?",
        "There were {c} {item} in each of {b} {box}, but {a} of them broke. How many {item} are still good?",
        "{name} gives {a} {item} to {other} from {b} {box} that [hold|have] {c} {item} each. How many {item} "
        "does {name} have left?",
        "How many {item} are left after {a} are [sold|used|eaten] from {b} {box} of {c} {item} each?",
        "{b} [friends|kids] each bring {c} {item}, and {a} {item} get [eaten|lost|used]. How many {item} are "
        "left?",
    ),
    "l3_sub_sub": (
        "{name} has {a} {item}, [gives|sells] {b} to a friend and then [loses|drops|uses] {c}. How many {item} are "
        "left?",
        "{name} started with {a} {item}, sold {b} and then gave {c} to {other}. How many {item} does {name} "
        "have now?",
        "A [jar|box|basket] held {a} {item}. {b} were taken out in the morning and {c} in the evening. How many "
        "{item} are left in it?",
        "{name} had {a} {item}. {name} gave {b} to {other} and {c} to a neighbour. How many {item} does {name} "
        "have left?",
        "There are {a} {item} on a shelf. {b} are sold before lunch and {c} after lunch. How many {item} are on "
        "the shelf now?",
        "{name} began the day with {a} {item}, used {b}, then gave away {c}. How many {item} remain?",
        "{name} [loses|uses|sells] {b} {item} and then {c} more. {name} had {a} {item} [at first|to begin with]. "
        "[How many {item} are left?|How many {item} does {name} have now?]",
        "Out of {a} {item}, {name} [eats|uses|sells] {b} and {other} [eats|uses|takes] {c}. How many {item} are "
        "left?",
        "How many {item} does {name} have [left|now] after [selling|using] {b} and then [losing|giving away] {c}, "
        "[starting from|out of] {a}?",
    ),
    "l3_sum_mul": (
        "One pack of {item} costs {a} dollars. {name} buys {b} packs and {other} buys {c} packs. How many "
        "dollars do they pay in total?",
        "Each pack of {item} costs {a} dollars. {name} buys {b} packs and {other} buys {c}. How many dollars do "
        "they spend together?",
        "{name} and {other} buy {b} and {c} packs of {item}. A pack costs {a} dollars. How many dollars do they "
        "spend altogether?",
        "{name} buys {b} packs of {item} and {other} buys {c} packs. Each pack costs {a} dollars. What do they "
        "spend in dollars?",
        "Packs of {item} cost {a} dollars each. {name} takes {b} packs and {other} takes {c} packs. What is the "
        "total cost in dollars?",
        "{name} wants {b} packs of {item}, and {other} wants {c} packs. If each pack is {a} dollars, how many "
        "dollars is that altogether?",
        "{name} [buys|orders|gets] {b} bags of {item} and {other} [buys|orders|gets] {c}. Every bag costs {a} "
        "dollars. [How much do they pay in dollars?|What is the total cost in dollars?]",
        "Tickets cost {a} dollars each. {name} needs {b} and {other} needs {c}. How many dollars [is that "
        "together|do they need in total]?",
        "{b} [kids|boys] and {c} [adults|girls] each [get|buy] a pack of {item} that costs {a} dollars. How many "
        "dollars [is that in all|do they spend altogether]?",
        "How many dollars do {name} and {other} pay for {b} and {c} packs of {item} if [a pack|each pack] costs {a} "
        "dollars?",
    ),
    # Level 4: three operations (the depth split under the default levels).
    "l4_add_mul_sub": (
        "{name} has {a} {item}, buys {b} {box} with {c} {item} in each, then gives {d} to {other}. How many "
        "{item} does {name} have now?",
        "{name} starts the day with {a} {item}, gets {b} more {box} of {c} {item} each, and then loses {d}. How "
        "many {item} are left?",  # reworded 2026-12-04: it repeated the l3_add_mul held-out template
        "[After buying|After getting|After receiving] {b} {box} of {c} {item} [each|apiece], {name} [gives|hands] "
        "{d} {item} to {other}. {name} had {a} {item} to begin with. How many {item} does {name} have [now|left]?",
        "Suppose {name} [owns|holds] {a} {item}, [takes in|accepts] {b} {box} of {c} apiece, and [spends|uses up] "
        "{d}. [What count of {item} remains?|How large is the pile of {item} afterwards?]",
        "[You have|You own] {a} {item}. You [buy|get] {b} {box} with {c} {item} in each and then [give away|lose|use] "
        "{d}. How many {item} do you have [now|left]?",
        "{name} [keeps|stores] {a} {item} in a drawer, [orders|receives] {b} {box} that each hold {c} {item}, and "
        "[later|afterwards] [donates|lends] {d} {item} to a school. What number of {item} does {name} end with?",
        "[First|To start], {name} [counts|has] {a} {item}. [Next|Then], {b} {box} arrive, each [holding|with] {c} "
        "{item}. [Last|Finally], {d} {item} [go to|are given to] {other}. How many {item} [stay with|remain with] "
        "{name}?",
        "{a} {item} [sit|wait] in {name}'s room. {name} [unpacks|opens] {b} {box} [of|containing] {c} {item} "
        "[each|apiece] and [mails|posts] {d} to a cousin. [Find how many {item} the room holds now.|How many {item} "
        "are in the room now?]",
        "Find the number of {item} {name} [ends up with|keeps|is left with]: {name} [owned|had] {a}, [bought|got] "
        "{b} {box} with {c} in each, and [sold|gave away|lost] {d}.",
        "{name}'s collection [held|had] {a} {item}. [A birthday|A trip|A fair] [added|brought] {b} {box} of {c} "
        "{item} [each|apiece], but {d} {item} were [ruined|misplaced] [soon after|a week later]. How many {item} "
        "are in the collection [now|at this point]?",
    ),
    "l4_mul_add_mul": (
        "{name} has {b} {box} with {c} {item} each and {d} {box} with {e} {item} each. How many {item} does "
        "{name} have?",
        "There are {b} {box} holding {c} {item} apiece and {d} more {box} holding {e} apiece. How many {item} "
        "are there in all?",
        "How many {item} are there [in total|altogether] in {b} {box} of {c} {item} [each|apiece] and {d} {box} of "
        "{e} {item} [each|apiece]?",
        "{name} [packs|fills] {b} {box} with {c} {item} each, and {other} [packs|fills] {d} {box} with {e} {item} "
        "each. How many {item} is that [together|between them|in total]?",
        "A [shelf|cart|truck] carries {b} {box} with {c} {item} in each and {d} [bigger|smaller|other] {box} with "
        "{e} {item} in each. How many {item} [does it carry|are on it]?",
        "[You buy|You order|You get] {b} {box} of {item} with {c} in each, and {d} {box} with {e} in each. How many "
        "{item} [do you get|is that]?",
        "{name} [counts|finds] {c} {item} in each of {b} {box} and {e} {item} in each of {d} [other|more] {box}. "
        "How many {item} does {name} count [in all|altogether]?",
        "Work out the total number of {item}: {b} {box} [hold|contain] {c} each, and {d} [other|more] {box} "
        "[hold|contain] {e} each.",
        "{name} [buys|gets|orders] {b} {box} with {c} {item} in each. {other} [buys|gets|orders] {d} {box} with {e} "
        "{item} in each. If they [put|combine] all the {item} together, how many [are there|do they have]?",
        "There are two kinds of {box}: {b} of them [hold|have] {c} {item} each, and {d} of them [hold|have] {e} "
        "{item} each. [How many {item} are there in total?|How many {item} do the {box} hold altogether?]",
    ),
    "l4_sum_mul_sub": (
        "One pack of {item} costs {a} dollars. {name} buys {b} packs and {other} buys {c} packs. A coupon takes "
        "{d} dollars off. How many dollars do they pay?",
        "{name} buys {b} packs of {item} and {other} buys {c}; each pack is {a} dollars, and they get {d} "
        "dollars back. What do they pay in dollars?",
        "{a} dollars [buys|gets you] one pack of {item}. {name} [grabs|selects] {b} packs, {other} [grabs|selects] "
        "{c}, and a [gift card|promo code] [saves|cuts] {d} dollars. [What is the amount paid, in dollars?|How many "
        "dollars leave their wallets?]",
        "How many dollars do {name} and {other} [spend|pay] if {name} buys {b} packs of {item}, {other} buys {c}, "
        "each pack costs {a} dollars, and they [get|receive] {d} dollars [off|back]?",
        "You [pick up|grab] {b} packs of {item}, and a friend [picks up|grabs] {c} more; the price is {a} dollars "
        "[per|for each] pack. A {d}-dollar [voucher|reward card] [is used|lowers the cost]. [What is the cost to you "
        "both|How much do you both pay], in dollars?",
        "[Our|The] [chess|drama|art] group [needs|puts in for] {b} packs of {item} for {name} and {c} for {other}. "
        "[Packs are|A pack is] {a} dollars, and the group [has|holds] a {d}-dollar credit. [How many dollars does the "
        "group pay?|What does the group owe in dollars?]",
        "[Together,|Between them,] {name} and {other} [walk out with|carry home] {b} plus {c} packs of {item}. "
        "[Every|Each] pack was {a} dollars, and the cashier [knocked|took] {d} dollars off the [total|sum]. How "
        "many dollars did they [hand over|pay]?",
        "Each pack of {item} [sells for|is priced at] {a} dollars. [On Monday|In the morning] {name} buys {b} "
        "packs; [on Tuesday|in the afternoon] {other} buys {c} packs. The shop [later refunds|gives back] {d} "
        "dollars. How many dollars did they spend [in the end|after that]?",
        "{name}'s cart has {b} packs of {item} and {other}'s has {c}; [the sticker says|the label reads] {a} "
        "dollars a pack. [At the till|At checkout] a {d}-dollar [rebate|markdown] [is deducted|comes off]. "
        "[Find|Give] the dollars they [hand over|part with].",
        "{other} [is after|would like] {c} packs of {item}, {name} [is after|would like] {b}, and [one pack|a single "
        "pack] [goes for|runs] {a} dollars. [A voucher|A store credit] covers {d} dollars of it. [How many dollars "
        "are left to pay?|What do they still owe, in dollars?]",
    ),
    "l4_sub_sub_sub": (
        "{name} has {a} {item}, gives {b} to {other}, loses {c} and sells {d}. How many {item} are left?",
        "A box held {a} {item}. {b} were used on Monday, {c} on Tuesday and {d} on Wednesday. How many {item} "
        "are left?",
        "{name} [buys|collects|has] {a} {item}. {b} go to {other}, {c} go to a neighbour and {d} [are lost|go "
        "missing|are dropped]. How many {item} [are left|remain]?",
        "{name} [owns|keeps] {a} {item} and [parts with|lets go of] {b} one week, {c} the [next|following] week and "
        "{d} the week after. [How many {item} remain with {name}?|How many {item} does {name} keep?]",
        "[You have|You start with] {a} {item}. You [give away|lose|use] {b}, then {c}, then {d} more. How many "
        "{item} do you have [left|now]?",
        "[The|A] [school|town] library [started the year with|held] {a} {item}. [Over the year|Since then] it "
        "[lost|retired|gave away] {b}, [misplaced|donated] {c}, and [sold|threw out] {d}. [What is its count of "
        "{item} now?|How many {item} does the library still hold?]",
        "{a} {item} [lie|sit] on a table. {name} [grabs|scoops up] {b}, {other} [grabs|scoops up] {c}, and {d} "
        "[are knocked off|fall off]. [Count|Say] how many {item} [are still on the table|stay on the table].",
        "{name}'s [tin|jar|drawer] [held|contained] {a} {item} [at dawn|first thing]. Three visitors [came "
        "by|stopped in]: the first took {b}, the second {c}, the third {d}. How many {item} [were still there "
        "afterwards|were left after the visits]?",
        "Start from {a} {item}, [subtract|take away|remove] {b}, then {c}, then {d}. How many {item} [are "
        "left|remain]?",
        "{name} [gave out|handed out] {b} {item} [in the morning|before lunch], {c} [at noon|after lunch] and {d} "
        "[in the evening|at night]. {name} [started with|began with|had] {a} {item}. How many does {name} have "
        "[left|now]?",
    ),
    # Level 5: four operations.
    "l5_mul_add_mul_sub": (
        "{name} has {b} {box} with {c} {item} each and {d} {box} with {e} {item} each, and gives {a} {item} to "
        "{other}. How many {item} does {name} have left?",
    ),
    "l5_add_mul_sub_sub": (
        "{name} has {a} {item}, buys {b} {box} with {c} {item} in each, gives {d} to {other} and loses {e}. "
        "How many {item} are left?",
    ),
}

HELD_OUT: dict[str, tuple[str, ...]] = {
    "l1_add": ("{a} + {b} = ?", "Find the sum of {a} and {b}."),
    "l1_sub": ("{a} - {b} = ?", "How much is {b} less than {a}?"),
    "l1_mul": ("{a} x {b} = ?", "How much is {a} multiplied by {b}?"),
    "l2_add": (
        "{name} starts with {a} {item}; {other} hands over another {b}. How many {item} does {name} hold now?",
        "If you have {a} {item} and someone gives you {b} more, how many {item} do you have?",
    ),
    "l2_sub": (
        "Of {a} {item}, {b} were used up. How many {item} are still there?",
        "{name} owned {a} {item} and handed {b} of them to {other}. How many {item} does {name} keep?",
    ),
    "l2_mul": (
        "What is the number of {item} in {a} {box} if every one holds {b}?",
        "{name} fills {a} {box} with {b} {item} apiece. How many {item} is that altogether?",
    ),
    "l2_div": (
        "How many {item} does each of {a} children receive when {ab} {item} are handed out equally?",
        "{name} packs {ab} {item} into {a} {box}, the same number in each. How many {item} are in one?",
    ),
    "l3_add_mul": (
        "Starting with {a} {item}, {name} adds {b} {box} of {c} {item} each. What is the total number of {item}?",
        "How many {item} does {name} end up with after getting {b} {box} holding {c} {item} apiece on top of "
        "{a}?",
    ),
    "l3_mul_sub": (
        "After removing {a} {item} from {b} {box} holding {c} each, how many {item} are still there?",
        "{name} keeps {b} {box} of {c} {item} but hands {a} {item} to {other}. How many {item} does {name} "
        "have left?",
    ),
    "l3_sub_sub": (
        "From {a} {item}, first {b} and then another {c} are removed. How many {item} remain?",
        "How many {item} are left if {name} had {a}, lost {b}, and later lost {c} more?",
    ),
    "l3_sum_mul": (
        "At {a} dollars a pack, how many dollars are {b} packs of {item} for {name} plus {c} packs for {other}?",
        "{name} gets {b} packs of {item} and {other} gets {c} packs; every pack is {a} dollars. What is the total "
        "bill in dollars?",
    ),
    # Levels 4 and 5: the family split of a run that trains on them (levels: [1, 2, 3, 4]).
    "l4_add_mul_sub": (
        "{name} already owns {a} {item}. Then {b} {box} arrive, each containing {c} {item}, and {d} {item} go to "
        "{other}. What number of {item} does {name} keep?",
        "Count the {item}: {a} to start, plus {b} {box} of {c}, minus {d} that {other} takes. How many {item} is "
        "that?",
    ),
    "l4_mul_add_mul": (
        "{name} stacks {b} {box} of {c} {item} and {other} stacks {d} {box} of {e} {item}. How many {item} are "
        "stacked altogether?",
        "A shelf has {b} rows of {c} {item} and a second shelf has {d} rows of {e} {item}. Find the total number "
        "of {item}.",
    ),
    "l4_sum_mul_sub": (
        "With packs of {item} priced at {a} dollars, {name} picks {b} and {other} picks {c}; a discount of {d} "
        "dollars applies. What is the bill in dollars?",
        "{b} packs for {name} and {c} packs for {other}, {a} dollars per pack, less a {d}-dollar voucher: how "
        "many dollars in total?",
    ),
    "l4_sub_sub_sub": (
        "A jar starts with {a} {item}. {name} takes {b}, {other} takes {c}, and {d} fall on the floor. How many "
        "{item} stay in the jar?",
        "{name} collected {a} {item} and then gave away {b}, then {c}, then {d}. How many {item} does {name} "
        "still hold?",
    ),
    "l5_mul_add_mul_sub": (
        "{b} {box} of {c} {item} and {d} {box} of {e} {item} are delivered to {name}, who passes {a} {item} to "
        "{other}. How many {item} does {name} keep?",
        "Add {b} {box} holding {c} {item} each to {d} {box} holding {e} each, then take away {a}. How many "
        "{item} remain?",
    ),
    "l5_add_mul_sub_sub": (
        "In the morning {name} counts {a} {item}; {b} {box} packed with {c} apiece come later, {d} go to {other} "
        "and {e} get lost. What number of {item} does {name} have in the end?",
        "Begin with {a} {item}, add {b} {box} of {c}, subtract {d} and then {e} more. How many {item} are there "
        "at the end?",
    ),
}
