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
author: hybrid-moe-kit
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
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import refusal, rule_user

MARK = "hybrid-moe-kit service account"


def _gecos_mark(entry):
    return entry.pw_gecos.split(",")[0]


def account_problems(name, group, mark, users, groups, user_var="service user", group_var="service group"):
    """Refusals for using `name`:`group` as the kit's account; `users`/`groups` are pwd/grp entries."""
    out = []
    for var, value in ((user_var, name), (group_var, group)):
        problem = rule_user(value)
        if problem:
            out.append(refusal(var, value, problem))
    if out:
        return out
    by_name = dict((u.pw_name, u) for u in users)
    ours = set(u.pw_name for u in users if _gecos_mark(u) == mark)
    user = by_name.get(name)
    if user is not None:
        if user.pw_uid == 0:
            out.append(refusal(user_var, name, "a dedicated unprivileged account, never uid 0"))
        elif name not in ours:
            out.append(refusal(
                user_var, name,
                "a new account the kit creates, or one it created before (GECOS \"%s\"); %s exists as uid %d "
                "(home %s, shell %s) and was not created by this kit, so it is left untouched. Choose another name; "
                "if this is the account an earlier version of the kit created, mark it with: usermod -c '%s' %s"
                % (mark, name, user.pw_uid, user.pw_dir, user.pw_shell, mark, name)))
    existing = dict((g.gr_name, g) for g in groups).get(group)
    if existing is not None:
        foreign = sorted(set([u.pw_name for u in users if u.pw_gid == existing.gr_gid and u.pw_name not in ours]
                             + [m for m in existing.gr_mem if m not in ours]))
        if existing.gr_gid == 0:
            out.append(refusal(group_var, group, "a dedicated group, never gid 0"))
        elif foreign:
            out.append(refusal(group_var, group, "a group of the kit's accounts only; %s also belongs to %s, "
                                                         "who would share what the service reads"
                                                         % (group, ", ".join(foreign))))
    return out


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
    changed = False
    try:
        grp.getgrnam(group)
    except KeyError:
        changed = True
        if not module.check_mode:
            module.run_command(["groupadd", "--system", group], check_rc=True)
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        user = None
    created = user is None
    if created:
        changed = True
        if not module.check_mode:
            module.run_command(["useradd", "--system", "--gid", group, "--no-create-home", "--home-dir", "/nonexistent",
                                "--shell", "/usr/sbin/nologin", "--comment", mark, name], check_rc=True)
            user = pwd.getpwnam(name)
    elif grp.getgrgid(user.pw_gid).gr_name != group:
        # The kit's own account, asked to run under another (kit-only) group.
        changed = True
        if not module.check_mode:
            module.run_command(["usermod", "--gid", group, name], check_rc=True)
    result = {"changed": changed, "created": created, "pending": changed}
    if user is not None:
        result["uid"] = user.pw_uid
    module.exit_json(**result)


if __name__ == "__main__":
    main()
