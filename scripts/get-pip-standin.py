# STAND-IN for ansible-test's get-pip script (NOT the upstream get-pip.py).
#
# ansible-test bootstraps pip into each per-test virtual environment by running
# ~/.ansible/test/cache/get_pip_<version>.py, downloaded from ci-files.testing.ansible.com, which this
# machine cannot reach. scripts/sanity copies this file there instead. It does what ansible-test needs
# from get-pip: install pip into the interpreter that runs it, from PyPI's own pip wheel. The wheel is
# fetched beforehand by scripts/sanity (`pip download pip==<version>`) into HMK_GET_PIP_WHEELS
# (default: the directory this file sits in); pip runs straight from that wheel to install itself.
#
# Called by ansible-test as: python get_pip_24_2.py --disable-pip-version-check pip==24.2 --no-setuptools --no-wheel
import glob
import os
import sys

# Options of the upstream get-pip that pip install itself does not know.
GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    wheels = os.environ.get("HMK_GET_PIP_WHEELS", here)
    args = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
    wanted = [a.split("==", 1)[1] for a in args if a.startswith("pip==")]
    pattern = "pip-%s-py3-none-any.whl" % (wanted[0] if wanted else "*")
    found = sorted(glob.glob(os.path.join(wheels, pattern)))
    if not found:
        sys.exit("get-pip stand-in: no %s in %s (scripts/sanity downloads it from PyPI)" % (pattern, wheels))
    wheel = found[-1]
    sys.path.insert(0, wheel)
    from pip._internal.cli.main import main as pip_main  # pylint: disable=import-outside-toplevel

    sys.exit(pip_main(["install", "--no-index", "--find-links", wheels] + args))


if __name__ == "__main__":
    main()
