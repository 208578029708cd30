"""Hardware: the profiles' schema (`schema`: conf/hardware, conf/precision, conf/strategy) and the hardware
settings a run takes from them (`settings`: detect the device, resolve the composed config into one set of settings,
apply them)."""
