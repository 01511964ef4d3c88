"""Settings in one place (cdc_assets/model/settings.py): the docs' table is the module's, and no other module of the
project spells a variable's name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cdc_assets.model import settings

REPO = Path(__file__).resolve().parent.parent
# A variable's name as a whole string: the project's own, the AWS SDK's it reads, Spark Connect's.
_VARIABLE = re.compile(r"^(CDC|AWS)_[A-Z0-9_]+$|^SPARK_(REMOTE|CONNECT_PORT)$")


def test_the_configuration_pages_table_is_the_settings_modules():
    page = (REPO / "docs" / "configuration.md").read_text()
    section = page[page.index("## Environment"):]
    table = section[section.index("| variable |"):].split("\n\n", 1)[0]
    assert table == settings.markdown_table(), "regenerate it: python -m cdc_assets.model.settings"


def test_every_setting_has_one_name_and_a_meaning():
    names = [setting.name for setting in settings.ALL]
    assert len(names) == len(set(names))
    assert all(setting.meaning for setting in settings.ALL)
    assert all(setting.shown_default for setting in settings.DOCUMENTED)


def test_no_module_but_the_settings_module_spells_a_variables_name():
    spelled = []
    for package in ("cdc_assets", "resources"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "cdc_assets" / "model" / "settings.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _VARIABLE.match(node.value):
                    spelled.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value}")
    assert spelled == [], "read it through cdc_assets.model.settings"
    # And the check can fail: the settings module itself spells each one.
    source = (REPO / "cdc_assets" / "model" / "settings.py").read_text()
    assert all(f'"{setting.name}"' in source for setting in settings.ALL)
