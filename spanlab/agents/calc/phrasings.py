"""How each kind of calc problem is worded: several phrasing families per kind, some held out.

A *phrasing family* is one template. Each kind's first template is the wording the tutorial always
used (``phrasings: original`` trains on it alone, as the main job did until it took ``all``); the rest of
``TRAIN`` are other wordings a training set may use (``phrasings: all``): for levels 1-3, six or seven per
kind, varied the way people ask (order of facts, verbs, question forms), so that a model trained on them
learns the arithmetic rather than one sentence. ``HELD_OUT`` templates are
never used for training or for the question-held-out splits: they make the ``family`` split, which
asks whether an agent learned the arithmetic or the sentence (``tests/agents/test_calc_tasks.py`` checks that
no training wording of levels 1-3 repeats a held-out one, or seven words of one). Levels 4 and 5 (three and four
operations) are never trained by the default levels; they make the ``depth`` split.

Slots: ``name``/``other`` (two different people), ``item`` (plural), ``box`` (plural container),
numbers ``a`` ... ``e`` and ``ab`` (``a * b``, for divisions).
"""

from __future__ import annotations

TRAIN: dict[str, tuple[str, ...]] = {
    # Level 1: a bare operation.
    "l1_add": (
        "What is {a} + {b}?",
        "Compute {a} plus {b}.",
        "What do you get when you add {a} and {b}?",
        "Calculate {a} + {b}.",
        "Add {a} and {b}.",
        "{a} plus {b} equals what?",
        "Please work out {a} + {b}.",
    ),
    "l1_sub": (
        "What is {a} - {b}?",
        "Compute {a} minus {b}.",
        "Subtract {b} from {a}.",
        "What is {a} take away {b}?",
        "Work out {a} minus {b}.",
        "What remains when {b} is taken from {a}?",
        "{a} minus {b} gives what number?",
    ),
    "l1_mul": (
        "What is {a} * {b}?",
        "Compute {a} times {b}.",
        "Multiply {a} by {b}.",
        "What is the product of {a} and {b}?",
        "Work out {a} times {b}.",
        "What number is {a} times {b}?",
        "Please calculate {a} * {b}.",
    ),
    # Level 2: one-step word problems.
    "l2_add": (
        "{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
        "{name} had {a} {item}. {other} gave {name} {b} more. How many {item} does {name} have?",
        "{name} collected {a} {item} on Monday and {b} {item} on Tuesday. How many {item} did {name} collect in total?",
        "{name} saved {a} {item} last week and {b} {item} this week. How many {item} has {name} saved?",
        "There are {a} {item} in one pile and {b} in another. How many {item} are there in all?",
        "{name} picks up {b} more {item}, adding to the {a} {item} {name} already had. How many {item} are there now?",
    ),
    "l2_sub": (
        "{name} has {a} {item} and gives away {b}. How many {item} are left?",
        "{name} had {a} {item} and lost {b} of them. How many {item} does {name} have left?",
        "A shop had {a} {item} and sold {b}. How many {item} remain?",
        "{name} had {a} {item}. {other} took {b}. How many {item} remain with {name}?",
        "A box holds {a} {item}. If {b} are taken away, how many {item} stay in the box?",
        "{name} needs to pack {a} {item} and has packed {b} so far. How many {item} still need packing?",
    ),
    "l2_mul": (
        "There are {a} {box} with {b} {item} in each. How many {item} are there?",
        "{name} has {a} {box}, and each holds {b} {item}. How many {item} does {name} have?",
        "Each of {a} {box} contains {b} {item}. What is the total number of {item}?",
        "{name} buys {a} {box} of {item}. Each one has {b} {item}. How many {item} did {name} buy?",
        "A store puts {b} {item} in each of its {a} {box}. How many {item} is that in total?",
        "{name} lays out {a} rows of {item}, {b} in a row. How many {item} are laid out?",
    ),
    "l2_div": (
        "{name} shares {ab} {item} equally among {a} friends. How many {item} does each friend get?",
        "{ab} {item} are split evenly into {a} {box}. How many {item} go in each?",
        "If {a} friends share {ab} {item} equally, how many {item} does each one get?",
        "{ab} {item} are shared out equally by {a} people. How many {item} does each person get?",
        "{name} puts {ab} {item} into {a} equal groups. How many {item} are in each group?",
        "Divide {ab} {item} evenly among {a} {box}. How many {item} go into each of them?",
    ),
    # Level 3: two operations.
    "l3_add_mul": (
        "{name} has {a} {item} and buys {b} {box} with {c} {item} in each. How many {item} does {name} have now?",
        "{name} already has {a} {item}. Then {name} buys {b} {box} that hold {c} {item} each. How many {item} "
        "does {name} have in total?",
        "A teacher has {a} {item} on the desk and {b} {box} of {c} {item} each in the cupboard. How many {item} "
        "are there altogether?",
        "{name} had {a} {item}. Today {name} got {b} more {box}, each with {c} {item}. How many {item} does "
        "{name} have altogether?",
        "In a room there are {a} loose {item} and {b} {box} with {c} {item} in every box. How many {item} are "
        "in the room?",
        "{name} has {a} {item} and wins {b} {box} containing {c} {item} each. How many {item} does {name} have now?",
    ),
    "l3_mul_sub": (
        "{name} has {b} {box} with {c} {item} in each and gives away {a} {item}. How many {item} are left?",
        "There are {b} {box} with {c} {item} each. {a} {item} are taken out. How many {item} remain?",
        "{name} buys {b} {box} of {c} {item} and then uses {a} of them. How many {item} are left?",
        "{name} bought {b} {box} with {c} {item} in each, then lost {a} {item}. How many {item} does {name} have "
        "now?",
        "A shop gets {b} {box} of {c} {item} and sells {a} {item}. How many {item} does the shop have left?",
        "There were {c} {item} in each of {b} {box}, but {a} of them broke. How many {item} are still good?",
    ),
    "l3_sub_sub": (
        "{name} has {a} {item}, gives {b} to a friend and then loses {c}. How many {item} are left?",
        "{name} started with {a} {item}, sold {b} and then gave {c} to {other}. How many {item} does {name} "
        "have now?",
        "A jar held {a} {item}. {b} were taken out in the morning and {c} in the evening. How many {item} are "
        "left in the jar?",
        "{name} had {a} {item}. {name} gave {b} to {other} and {c} to a neighbour. How many {item} does {name} "
        "have left?",
        "There are {a} {item} on a shelf. {b} are sold before lunch and {c} after lunch. How many {item} are on "
        "the shelf now?",
        "{name} began the day with {a} {item}, used {b}, then gave away {c}. How many {item} remain?",
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
    ),
    # Level 4: three operations (the depth split under the default levels).
    "l4_add_mul_sub": (
        "{name} has {a} {item}, buys {b} {box} with {c} {item} in each, then gives {d} to {other}. How many "
        "{item} does {name} have now?",
        "Starting with {a} {item}, {name} adds {b} {box} of {c} {item} each and then loses {d}. How many {item} "
        "are left?",
    ),
    "l4_mul_add_mul": (
        "{name} has {b} {box} with {c} {item} each and {d} {box} with {e} {item} each. How many {item} does "
        "{name} have?",
        "There are {b} {box} holding {c} {item} apiece and {d} more {box} holding {e} apiece. How many {item} "
        "are there in all?",
    ),
    "l4_sum_mul_sub": (
        "One pack of {item} costs {a} dollars. {name} buys {b} packs and {other} buys {c} packs. A coupon takes "
        "{d} dollars off. How many dollars do they pay?",
        "{name} buys {b} packs of {item} and {other} buys {c}; each pack is {a} dollars, and they get {d} "
        "dollars back. What do they pay in dollars?",
    ),
    "l4_sub_sub_sub": (
        "{name} has {a} {item}, gives {b} to {other}, loses {c} and sells {d}. How many {item} are left?",
        "A box held {a} {item}. {b} were used on Monday, {c} on Tuesday and {d} on Wednesday. How many {item} "
        "are left?",
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
}
