"""`slotsched simulate --compare`: the contenders (`contenders`), the run (`run`), the figures
(`metrics`), the report (`report`) and the plots (`plots`)."""
