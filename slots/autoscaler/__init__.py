"""The companion autoscaler: a pure decision (`decision`), the loop that gathers, decides and acts
(`loop`), where it reads demand and changes membership (`demand`), and its metrics (`metrics`).
Actuators are in `slots.actuators`."""
