"""The console's routes, one module per group of pages and the actions on them.

``overview`` (the overview, events, agents and draining one, the live stream),
``messages`` (the message list, one message, cancelling it), ``dead_letters`` (the
dead-letter queue: a letter, replay, purge), ``audit`` (the audit trail, and who the
console's actions are recorded as) and ``forms`` (reading a posted form, the
checks a change must pass, sign-in). :func:`reach.web.app.create_app` puts them in its
route table.
"""
