"""Published measurements the training estimates are checked against (see
:mod:`shardlab.train.validate`)."""
