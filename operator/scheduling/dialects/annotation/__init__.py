"""The annotation dialect (HAMi's protocol): what the mutating webhook does to a
pod (``admission``), Fit of one container on a node's cards (``fit``), one pod on one node,
booking as it goes (``placement``), and Fit judged by classes of identical cards for a
pod's verdict (``card_classes``).
"""
