#!/usr/bin/python
# -*- coding: utf-8 -*-
"""The kit's dedicated service account: created by the kit, marked as such, and never someone else's."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_service_account
short_description: Create the dedicated system account a service runs as, refusing any account the kit did not create
description:
  - Creates a system group and a system user without a login shell or a home directory, marked in its GECOS
    field as the kit's (C(hybrid-moe-kit service account)).
  - Refuses, before any change, root (by name or uid 0), a group with gid 0, an existing account without the
    kit's mark (a login user, a daemon's account), and a group that an account the kit did not create uses.
    Nothing of an existing account is ever modified.
  - In check mode it only says what it would create, or refuses; roles run it that way in their validation step.
options:
  name:
    description: User name.
    type: str
    required: true
  group:
    description: Primary group (created when missing); defaults to the user name.
    type: str
  comment:
    description: The mark in the GECOS field that says the kit created the account.
    type: str
    default: hybrid-moe-kit service account
  user_var:
    description: The variable the user name came from, named in refusals.
    type: str
    default: service user
  group_var:
    description: The variable the group name came from, named in refusals.
    type: str
    default: service group
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: The inference service's system account exists
  hmk.moe_kit.hmk_service_account:
    name: hmk-inference
    group: hmk-inference
    user_var: inference_service_user
    group_var: inference_service_group
"""

RETURN = r"""
uid:
  description: The account's uid (absent in check mode before creation).
  type: int
  returned: when the account exists
created:
  description: Whether the user was absent (and, outside check mode, was created by this run).
  type: bool
  returned: always
pending:
  description:
    - Whether the account needed a change (the same as C(changed), kept when a task's C(changed_when) masks that),
      so that a role which validated in check mode visits again only when there is something to do.
  type: bool
  returned: always
"""

import grp
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import MARK, account_pending, account_problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            group=dict(type="str"),
            comment=dict(type="str", default=MARK),
            user_var=dict(type="str", default="service user"),
            group_var=dict(type="str", default="service group"),
        ),
        supports_check_mode=True,
    )
    name, mark = module.params["name"], module.params["comment"]
    group = module.params["group"] or name
    problems = account_problems(name, group, mark, pwd.getpwall(), grp.getgrall(), module.params["user_var"],
                                module.params["group_var"])
    if problems:
        module.fail_json(msg="refused before any change: " + " | ".join(problems), refusals=problems, created=False)
    state = account_pending(name, group, pwd.getpwall(), grp.getgrall())
    changed = state["pending"]
    if state["group_missing"] and not module.check_mode:
        module.run_command(["groupadd", "--system", group], check_rc=True)
    created = state["user_missing"]
    user = None
    if created:
        if not module.check_mode:
            module.run_command(["useradd", "--system", "--gid", group, "--no-create-home", "--home-dir", "/nonexistent",
                                "--shell", "/usr/sbin/nologin", "--comment", mark, name], check_rc=True)
            user = pwd.getpwnam(name)
    else:
        user = pwd.getpwnam(name)
        if state["wrong_group"] and not module.check_mode:
            # The kit's own account, asked to run under another (kit-only) group.
            module.run_command(["usermod", "--gid", group, name], check_rc=True)
    result = {"changed": changed, "created": created, "pending": changed}
    if user is not None:
        result["uid"] = user.pw_uid
    module.exit_json(**result)


if __name__ == "__main__":
    main()
