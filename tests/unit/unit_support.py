"""Helpers more than one unit test needs: the scripts under scripts/ loaded as modules, and values marked as trusted
templates for Ansible's templar (the tests that render the roles' own expressions in process)."""
import importlib.machinery
import importlib.util


def load_script(name, path):
    """The script at `path` (no .py suffix, so its loader is named) as a module called `name`."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def trust(value):
    """`value` with every string in it marked as a trusted template (ansible-core 2.19 renders no other)."""
    from ansible.template import trust_as_template  # pylint: disable=import-outside-toplevel

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trust(item) for item in value]
    if isinstance(value, dict):
        return dict((key, trust(item)) for key, item in value.items())
    return value
