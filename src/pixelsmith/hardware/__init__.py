"""Hardware: the profiles' schema (`schema`: conf/hardware, conf/precision, conf/strategy) and the plan a run takes
from them (`plan`: detect the device, resolve the composed config into one plan, apply it)."""
