"""Which settings go together: :mod:`lmlab.setting_rules` (below the packages, so that any layer,
an objective's parameters included, states its rules with it), under the name the sections use."""

from lmlab.setting_rules import (  # noqa: F401
    KEYWORDS,
    STYLES,
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
