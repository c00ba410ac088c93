//! IB CM: MADs on QP1 and the connection state machine (IBTA vol. 1 ch. 12).
