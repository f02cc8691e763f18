"""The methods' client maths: each method's ``LocalUpdate`` (``clients/<method>.py``) and the
terms they share (``control_variates``, ``dynamic``, ``gam``, ``sharpness``). The one client that
runs any of them is ``fl_app.node.drift_client.DriftClient``."""
