"""Which settings go together: :mod:`lmlab.setting_rules` (below the packages, so that any layer,
an objective's parameters included, states its rules with it), under the name the sections use."""

from lmlab.setting_rules import (  # noqa: F401
    KEYWORDS,
    Excludes,
    ForArchitectures,
    Needs,
    NotAbove,
    Rule,
    SettingNames,
    check_architecture,
    check_rules,
    is_set,
)


def settings_given(rules, written, value, default, section: str, origin, set_at_default: bool = False):
    """``(given, turned_off)`` of a section's settings for its ``rules``: ``given``, the names of
    ``written`` (the keys a file or ``--set`` wrote) whose value is not the default (a recipe and a
    run's saved config write every key; ``set_at_default``: one ``--set`` gave counts at any value);
    ``turned_off``, those a ``--set`` partner over the file's setting makes do nothing (``--set
    train.schedule=constant`` on a recipe with ``min_lr``): the command line wins, as ``--set`` does,
    so the caller puts each back to its default (the run is the same, and its saved config, which
    ``--resume`` reads back, trips no rule); they are not in ``given``. ``value(name)`` and
    ``default(name)``: what the run will use, and the default; ``origin`` says what ``--set`` gave
    (``section.NAME``)."""
    def by_set(name):
        return origin.from_command_line(f"{section}.{name}")

    given = {k for k in written if (set_at_default and by_set(k)) or value(k) != default(k)}
    turned_off = [r.flag for r in rules if r.flag in given and not by_set(r.flag) and by_set(r.partner)
                  and r.broken(value)]
    return given - set(turned_off), turned_off
